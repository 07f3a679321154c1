//! The debug level is read from `UOPC_DEBUG`, never from a bare `DEBUG` (its own test binary:
//! the level is read once per process).

use uopc_tensor::{DEBUG_ENV, debug_level};

#[test]
fn the_level_comes_from_uopc_debug_not_debug() {
    assert_eq!(DEBUG_ENV, "UOPC_DEBUG");
    // SAFETY: this binary has one test, so no other thread reads or writes the environment
    // while it runs.
    unsafe {
        std::env::set_var("DEBUG", "5");
        std::env::set_var(DEBUG_ENV, "2");
    }
    assert_eq!(debug_level(), 2);
}

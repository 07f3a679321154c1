//! Newtyped ids of a program's ranges, buffer and variable arguments and local allocations, so
//! a range id cannot be passed where a buffer slot is meant.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(usize);

        impl $name {
            /// The id numbered `index`.
            #[must_use]
            pub const fn new(index: usize) -> Self {
                $name(index)
            }

            /// Its number (an argument position for slots).
            #[must_use]
            pub const fn index(self) -> usize {
                self.0
            }
        }

        /// From its number, so builders accept plain literals (`buffer(0, ..)`).
        impl From<usize> for $name {
            fn from(index: usize) -> Self {
                $name(index)
            }
        }

        /// The bare number, as the printers show it (`buf0`, `r3`).
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        /// The bare number, so `Op`'s derived `Debug` reads as before (`Range { id: 3, .. }`).
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}

id_type!(
    /// The id of a RANGE, unique within a program ([`crate::ProgramBuilder`] hands them out).
    RangeId
);
id_type!(
    /// The argument position of a BUFFER: the program's buffers are slots `0..n`.
    BufferSlot
);
id_type!(
    /// The slot of an ALLOC, telling a program's local allocations apart.
    AllocSlot
);
id_type!(
    /// The argument position of a VAR among the program's scalar arguments, `0..n`.
    VarSlot
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_order_as_their_numbers() {
        let (a, b) = (RangeId::new(3), RangeId::from(12));
        assert_eq!((a.index(), b.index()), (3, 12));
        assert!(a < b);
        assert_eq!(format!("r{a} buf{} {:?}", BufferSlot::new(7), VarSlot::new(2)), "r3 buf7 2");
        assert_eq!(AllocSlot::default(), AllocSlot::new(0));
    }
}

//! uopc

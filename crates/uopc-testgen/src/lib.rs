//! Random well-formed programs for differential testing.

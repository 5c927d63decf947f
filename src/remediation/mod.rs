//! See crate docs.

//! The decoder's matrix products are the shared [`crate::layers::linear`].

pub use crate::layers::linear::{linear, linear_many};

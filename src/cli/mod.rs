//! Command-line entry points; each subcommand owns one file.

pub mod components;
pub mod crds;
#[cfg(feature = "sandbox")]
pub mod demo;
pub mod etcd;
pub mod heap;
pub mod inspect;
pub mod restore;
pub mod run;

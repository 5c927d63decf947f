//! Local stand-ins for tests and the demo: real etcd clusters, and what CAPI
//! itself would do to Machines.

pub mod capi_sim;

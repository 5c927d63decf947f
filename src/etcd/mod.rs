//! The etcd membership engine: verified mutual-TLS connections to each member
//! of a k3s embedded etcd, the membership snapshot (members, own-endpoint
//! health, alarms, leader), and the operations that change it safely (move
//! leadership, remove a member, quorum-checked removal).
//!
//! - [`tls`]: CA, client identity from PEM or minted from the etcd CA.
//! - [`transport`]: member client URL -> where to dial + which name to verify.
//! - [`client`]: one single-endpoint client per member, with timeouts.
//! - [`cluster`]: the handle ([`EtcdCluster`]) and the snapshot.
//! - [`snapshot`]: the observed membership and its quorum views.
//! - [`ops`]: move leader, remove member, safe remove.
//! - [`serving_certs`]: each member's serving certificate expiry, from our handshakes.
//! - [`save`]: stream a snapshot from one healthy voter, verified on the fly.
//! - [`keys`]: whether one key exists (the restore rule's check).
//! - [`space_ops`]: defragment, compact, disarm NOSPACE, guarded by [`crate::space_rule`].
//! - [`error`]: [`EtcdError`], classified so it tells the user what is wrong.

pub mod client;
pub mod cluster;
pub mod error;
mod h2_channel;
pub mod keys;
pub mod ops;
pub mod save;
pub mod serving_certs;
pub mod snapshot;
pub mod snapshot_verify;
pub mod space_ops;
pub mod tls;
pub mod transport;

pub use client::Timeouts;
pub use cluster::{EtcdCluster, ListedMember};
pub use error::EtcdError;
pub use ops::{LeaderMove, Removal, SafeRemoval};
pub use save::{SaveSnapshotError, SnapshotSink, StreamedSnapshot, snapshot_source};
pub use snapshot::{
    ForeignCluster, MemberSnapshot, MemberStatus, MembershipSnapshot, parse_member_id,
};
pub use space_ops::{Compacted, Defragmented, Disarmed};
pub use tls::{ClientCertMinter, ClientCertSource, ClientIdentity, ClientTls, ServerCa, TlsError};
pub use transport::{EtcdEndpoint, Transport};

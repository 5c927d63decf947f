//! Where snapshots are stored: S3-compatible object storage or a filesystem
//! path, behind one interface (the `object_store` crate does the HTTP, the
//! request signing and the multipart uploads).
//!
//! Objects are laid out as k3s lays out its own: `<folder>/<name>` in the
//! bucket (k3s `pkg/etcd/s3/s3.go`, `Upload`), `<path>/<name>` on a
//! filesystem. TLS to the endpoint is always verified: `skip_tls_verify` is
//! refused, and a private CA is given as `endpoint_ca_pem`. Errors name the
//! field at fault and the object, and never carry a credential.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, Certificate, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig,
    WriteMultipart,
};

use crate::backup::error::BackupError;
use crate::backup::retention::StoredSnapshot;

/// Where to store snapshots. Plain Rust: the controller fills it from its
/// spec and Secrets, the CLI from flags and the environment.
#[derive(Clone, PartialEq, Eq)]
pub enum TargetConfig {
    S3(S3Config),
    Filesystem { path: PathBuf },
}

/// An S3-compatible bucket, with k3s's settings (`--etcd-s3-*`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Config {
    /// `host[:port]` as k3s takes it (the scheme follows `insecure`), or a
    /// URL whose scheme agrees with `insecure`.
    pub endpoint: String,
    pub bucket: String,
    /// Key prefix; objects are `<folder>/<name>` (empty: the bucket's root).
    pub folder: String,
    /// Empty means `us-east-1`, k3s's default.
    pub region: String,
    /// Plain HTTP (k3s `--etcd-s3-insecure`).
    pub insecure: bool,
    /// k3s's `--etcd-s3-skip-ssl-verify`: always refused here.
    pub skip_tls_verify: bool,
    /// The CA bundle (PEM) the endpoint's certificate chains to, when it is
    /// not a public one.
    pub endpoint_ca_pem: Option<String>,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the credentials.
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("folder", &self.folder)
            .field("region", &self.region)
            .field("insecure", &self.insecure)
            .field("skip_tls_verify", &self.skip_tls_verify)
            .field(
                "endpoint_ca_pem",
                &self.endpoint_ca_pem.as_ref().map(|_| "<pem>"),
            )
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for TargetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetConfig::S3(s3) => f.debug_tuple("S3").field(s3).finish(),
            TargetConfig::Filesystem { path } => {
                f.debug_struct("Filesystem").field("path", path).finish()
            }
        }
    }
}

/// k3s's default region (k3s `pkg/etcd/s3/s3.go`, `defaultEtcdS3`).
pub const DEFAULT_REGION: &str = "us-east-1";

/// The settings of a target, as errors name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Endpoint,
    Bucket,
    Folder,
    Region,
    Insecure,
    SkipTlsVerify,
    EndpointCa,
    AccessKeyId,
    SecretAccessKey,
    SessionToken,
    Path,
}

/// How errors name a field: as the controller's spec does, or as the CLI's
/// flags and environment do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FieldNames {
    #[default]
    Spec,
    Flags,
}

impl FieldNames {
    pub fn name(self, field: Field) -> &'static str {
        match (self, field) {
            (FieldNames::Spec, Field::Endpoint) => "spec.etcdBackup.target.s3.endpoint",
            (FieldNames::Spec, Field::Bucket) => "spec.etcdBackup.target.s3.bucket",
            (FieldNames::Spec, Field::Folder) => "spec.etcdBackup.target.s3.folder",
            (FieldNames::Spec, Field::Region) => "spec.etcdBackup.target.s3.region",
            (FieldNames::Spec, Field::Insecure) => "spec.etcdBackup.target.s3.insecure",
            (FieldNames::Spec, Field::SkipTlsVerify) => "spec.etcdBackup.target.s3.skipTLSVerify",
            (FieldNames::Spec, Field::EndpointCa) => "spec.etcdBackup.target.s3.endpointCASecret",
            (FieldNames::Spec, Field::AccessKeyId) => {
                "spec.etcdBackup.target.s3.credentialsSecret (access key id)"
            }
            (FieldNames::Spec, Field::SecretAccessKey) => {
                "spec.etcdBackup.target.s3.credentialsSecret (secret access key)"
            }
            (FieldNames::Spec, Field::SessionToken) => {
                "spec.etcdBackup.target.s3.credentialsSecret (session token)"
            }
            (FieldNames::Spec, Field::Path) => "spec.etcdBackup.target.filesystem.path",
            (FieldNames::Flags, Field::Endpoint) => "--s3-endpoint",
            (FieldNames::Flags, Field::Bucket) => "--s3-bucket",
            (FieldNames::Flags, Field::Folder) => "--s3-folder",
            (FieldNames::Flags, Field::Region) => "--s3-region",
            (FieldNames::Flags, Field::Insecure) => "--s3-insecure",
            (FieldNames::Flags, Field::SkipTlsVerify) => "--s3-skip-ssl-verify",
            (FieldNames::Flags, Field::EndpointCa) => "--s3-endpoint-ca",
            (FieldNames::Flags, Field::AccessKeyId) => "AWS_ACCESS_KEY_ID",
            (FieldNames::Flags, Field::SecretAccessKey) => "AWS_SECRET_ACCESS_KEY",
            (FieldNames::Flags, Field::SessionToken) => "AWS_SESSION_TOKEN",
            (FieldNames::Flags, Field::Path) => "--dir",
        }
    }
}

/// S3 parts are at least 5 MiB (but the last); a filesystem takes any size.
const S3_PART: usize = 5 * 1024 * 1024;
const FS_PART: usize = 1024 * 1024;

/// The name of k3s's metadata folder beside its snapshots (k3s
/// `pkg/etcd/snapshot/types.go`, `MetadataDir`): never a snapshot.
const METADATA_DIR: &str = ".metadata";

/// An opened target.
pub struct Target {
    store: Arc<dyn ObjectStore>,
    folder: ObjectPath,
    kind: Kind,
    fields: FieldNames,
    /// Values that must never appear in an error (credentials).
    secrets: Vec<String>,
    part_size: usize,
    /// Parts in flight at once, besides the one being filled.
    concurrency: usize,
}

#[derive(Clone, Debug)]
enum Kind {
    S3 { endpoint: String, bucket: String },
    Filesystem { path: PathBuf },
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Target {
    /// Open `config`, naming fields as the controller's spec does. Checks the
    /// settings only; [`Self::check`] reaches the target.
    pub fn open(config: &TargetConfig) -> Result<Target, BackupError> {
        Self::open_with(config, FieldNames::Spec)
    }

    /// [`Self::open`], naming fields as `fields` says.
    pub fn open_with(config: &TargetConfig, fields: FieldNames) -> Result<Target, BackupError> {
        match config {
            TargetConfig::Filesystem { path } => Self::open_filesystem(path, fields),
            TargetConfig::S3(s3) => Self::open_s3(s3, fields),
        }
    }

    fn open_filesystem(path: &std::path::Path, fields: FieldNames) -> Result<Target, BackupError> {
        let field = fields.name(Field::Path);
        let invalid = |reason: String| BackupError::Config { field, reason };
        if path.as_os_str().is_empty() {
            return Err(invalid("is empty".into()));
        }
        // Like k3s for a snapshot directory it did not choose: it must exist.
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(invalid(format!("{} is not a directory", path.display()))),
            Err(e) => return Err(invalid(format!("{}: {e}", path.display()))),
        }
        // fsync the file and its directory before the rename that publishes
        // it: a backup that a crash can lose is no backup (etcdctl syncs too).
        let store = LocalFileSystem::new_with_prefix(path)
            .map_err(|e| invalid(format!("{}: {e}", path.display())))?
            .with_fsync(true);
        Ok(Target {
            store: Arc::new(store),
            folder: ObjectPath::default(),
            kind: Kind::Filesystem {
                path: path.to_path_buf(),
            },
            fields,
            secrets: Vec::new(),
            part_size: FS_PART,
            concurrency: 2,
        })
    }

    fn open_s3(s3: &S3Config, fields: FieldNames) -> Result<Target, BackupError> {
        let invalid = |field: Field, reason: String| BackupError::Config {
            field: fields.name(field),
            reason,
        };
        if s3.skip_tls_verify {
            return Err(invalid(
                Field::SkipTlsVerify,
                format!(
                    "TLS to the endpoint is always verified here; give the CA its certificate chains to in {} instead",
                    fields.name(Field::EndpointCa)
                ),
            ));
        }
        let endpoint = endpoint_url(&s3.endpoint, s3.insecure)
            .map_err(|reason| invalid(Field::Endpoint, reason))?;
        check_bucket(&s3.bucket).map_err(|reason| invalid(Field::Bucket, reason))?;
        let folder = folder_path(&s3.folder).map_err(|reason| invalid(Field::Folder, reason))?;
        if s3.access_key_id.is_empty() {
            return Err(invalid(Field::AccessKeyId, "is empty".into()));
        }
        if s3.secret_access_key.is_empty() {
            return Err(invalid(Field::SecretAccessKey, "is empty".into()));
        }
        let region = if s3.region.is_empty() {
            DEFAULT_REGION
        } else {
            s3.region.as_str()
        };
        let mut options = ClientOptions::new()
            .with_allow_http(s3.insecure)
            .with_connect_timeout(Duration::from_secs(5))
            // Parts of 5 MiB on a slow link; the caller bounds the whole.
            .with_timeout(Duration::from_secs(120));
        if let Some(pem) = &s3.endpoint_ca_pem {
            for cert in parse_ca(pem).map_err(|reason| invalid(Field::EndpointCa, reason))? {
                options = options.with_root_certificate(cert);
            }
        }
        let mut builder = AmazonS3Builder::new()
            .with_endpoint(&endpoint)
            .with_bucket_name(&s3.bucket)
            .with_region(region)
            .with_access_key_id(&s3.access_key_id)
            .with_secret_access_key(&s3.secret_access_key)
            .with_allow_http(s3.insecure)
            .with_virtual_hosted_style_request(virtual_hosted(&endpoint, &s3.bucket))
            .with_client_options(options)
            // A few quick retries: an unreachable endpoint is reported in
            // seconds, not after the crate's default three minutes.
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(2),
                    base: 2.0,
                },
                max_retries: 2,
                retry_timeout: Duration::from_secs(15),
            });
        if let Some(token) = s3.session_token.as_ref().filter(|t| !t.is_empty()) {
            builder = builder.with_token(token);
        }
        let store = builder
            .build()
            .map_err(|e| invalid(Field::Endpoint, e.to_string()))?;
        let mut secrets = vec![s3.secret_access_key.clone(), s3.access_key_id.clone()];
        secrets.extend(s3.session_token.clone().filter(|t| !t.is_empty()));
        Ok(Target {
            store: Arc::new(store),
            folder,
            kind: Kind::S3 {
                endpoint,
                bucket: s3.bucket.clone(),
            },
            fields,
            secrets,
            part_size: S3_PART,
            concurrency: 1,
        })
    }

    /// `s3://bucket/folder at https://endpoint` or `dir /path`: for logs and
    /// errors, never a credential.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::S3 { endpoint, bucket } => {
                if self.folder.as_ref().is_empty() {
                    format!("s3://{bucket} at {endpoint}")
                } else {
                    format!("s3://{bucket}/{} at {endpoint}", self.folder)
                }
            }
            Kind::Filesystem { path } => format!("directory {}", path.display()),
        }
    }

    /// Where `name` is stored, as k3s would name it: `s3://bucket/folder/name`
    /// or `file:///path/name`.
    pub fn location(&self, name: &str) -> String {
        match &self.kind {
            Kind::S3 { bucket, .. } => format!("s3://{bucket}/{}", self.path(name)),
            Kind::Filesystem { path } => format!("file://{}", path.join(name).display()),
        }
    }

    fn path(&self, name: &str) -> ObjectPath {
        self.folder.clone().join(name)
    }

    /// Reach the target: the bucket exists, the credentials are accepted, the
    /// folder can be listed.
    pub async fn check(&self) -> Result<(), BackupError> {
        let prefix = (!self.folder.as_ref().is_empty()).then_some(&self.folder);
        self.store
            .list_with_delimiter(prefix)
            .await
            .map(|_| ())
            .map_err(|e| self.error("list", None, e))
    }

    /// Start storing `name`: the bytes go out in parts as they are written,
    /// so memory stays bounded by a few parts whatever the size.
    pub async fn put(&self, name: &str) -> Result<Upload<'_>, BackupError> {
        let path = self.path(name);
        let upload = self
            .store
            .put_multipart(&path)
            .await
            .map_err(|e| self.error("upload", Some(name), e))?;
        Ok(Upload {
            target: self,
            name: name.to_string(),
            writer: WriteMultipart::new_with_chunk_size(upload, self.part_size),
            written: 0,
        })
    }

    /// The snapshots (and other objects) directly in the folder, k3s's
    /// `.metadata` objects left out, oldest first.
    pub async fn list(&self) -> Result<Vec<StoredSnapshot>, BackupError> {
        let prefix = (!self.folder.as_ref().is_empty()).then_some(&self.folder);
        let depth = self.folder.parts().count();
        let mut listed = self.store.list(prefix);
        let mut found = Vec::new();
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| self.error("list", None, e))?;
            let parts: Vec<_> = meta.location.parts().collect();
            if parts.len() != depth + 1 {
                continue; // in a subfolder (k3s's .metadata/, anything else)
            }
            let name = parts[depth].as_ref().to_string();
            if name == METADATA_DIR {
                continue;
            }
            found.push(StoredSnapshot::new(
                &name,
                meta.size,
                SystemTime::from(meta.last_modified),
            ));
        }
        found.sort_by(|a, b| {
            a.last_modified
                .cmp(&b.last_modified)
                .then_with(|| a.name.cmp(&b.name))
        });
        Ok(found)
    }

    /// What is stored under `name`.
    pub async fn head(&self, name: &str) -> Result<StoredSnapshot, BackupError> {
        let meta = self
            .store
            .head(&self.path(name))
            .await
            .map_err(|e| self.error("head", Some(name), e))?;
        Ok(StoredSnapshot::new(
            name,
            meta.size,
            SystemTime::from(meta.last_modified),
        ))
    }

    /// Whether `name` is stored.
    pub async fn exists(&self, name: &str) -> Result<bool, BackupError> {
        match self.head(name).await {
            Ok(_) => Ok(true),
            Err(BackupError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Delete `name` (nothing stored is success).
    pub async fn delete(&self, name: &str) -> Result<(), BackupError> {
        match self.store.delete(&self.path(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("delete", Some(name), e)),
        }
    }

    /// The bytes of `name`, streamed.
    pub async fn read(
        &self,
        name: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, BackupError>>, BackupError> {
        let got = self
            .store
            .get(&self.path(name))
            .await
            .map_err(|e| self.error("read", Some(name), e))?;
        let target = self.describe();
        let object = self.location(name);
        let secrets = self.secrets.clone();
        Ok(got
            .into_stream()
            .map(move |chunk| {
                chunk.map_err(|e| BackupError::Target {
                    target: target.clone(),
                    op: "read",
                    object: Some(object.clone()),
                    detail: scrub(&error_text(&e), &secrets),
                })
            })
            .boxed())
    }

    /// An object_store error of `op` on `name` as a [`BackupError`] naming
    /// the field at fault, with credentials scrubbed from the text.
    fn error(&self, op: &'static str, name: Option<&str>, err: object_store::Error) -> BackupError {
        let text = scrub(&error_text(&err), &self.secrets);
        let target = self.describe();
        let object = name.map(|n| self.location(n));
        if let object_store::Error::NotFound { .. } = err
            && let Some(object) = object.clone()
            && !text.contains("NoSuchBucket")
        {
            return BackupError::NotFound { target, object };
        }
        let Kind::S3 { endpoint, bucket } = &self.kind else {
            return BackupError::Target {
                target,
                op,
                object,
                detail: text,
            };
        };
        let fields = self.fields;
        if text.contains("NoSuchBucket") {
            return BackupError::BucketNotFound {
                field: fields.name(Field::Bucket),
                bucket: bucket.clone(),
                endpoint: endpoint.clone(),
            };
        }
        if matches!(
            err,
            object_store::Error::Unauthenticated { .. }
                | object_store::Error::PermissionDenied { .. }
        ) || [
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "AccessDenied",
            "InvalidToken",
            "ExpiredToken",
            "403 Forbidden",
        ]
        .iter()
        .any(|needle| text.contains(needle))
        {
            // A known key with a wrong signature: the secret is at fault.
            let field = if text.contains("SignatureDoesNotMatch") {
                Field::SecretAccessKey
            } else {
                Field::AccessKeyId
            };
            return BackupError::Credentials {
                field: fields.name(field),
                target,
                detail: s3_code(&text).unwrap_or(text),
            };
        }
        if [
            "UnknownIssuer",
            "invalid peer certificate",
            "certificate verify",
            "NotValidForName",
        ]
        .iter()
        .any(|needle| text.contains(needle))
        {
            return BackupError::Tls {
                field: fields.name(Field::EndpointCa),
                endpoint: endpoint.clone(),
                detail: text,
            };
        }
        if [
            "Connection refused",
            "connection refused",
            "tcp connect error",
            "dns error",
            "error trying to connect",
            "timed out",
            "No route to host",
        ]
        .iter()
        .any(|needle| text.contains(needle))
        {
            return BackupError::Unreachable {
                field: fields.name(Field::Endpoint),
                endpoint: endpoint.clone(),
                detail: text,
            };
        }
        BackupError::Target {
            target,
            op,
            object,
            detail: text,
        }
    }
}

/// A streamed upload of one object; nothing is visible under its name until
/// [`Self::finish`], and [`Self::abort`] leaves nothing behind.
pub struct Upload<'a> {
    target: &'a Target,
    name: String,
    writer: WriteMultipart,
    written: u64,
}

impl Upload<'_> {
    /// Add `chunk`, waiting while too many parts are in flight.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), BackupError> {
        self.writer
            .wait_for_capacity(self.target.concurrency)
            .await
            .map_err(|e| self.target.error("upload", Some(&self.name), e))?;
        self.writer.write(chunk);
        self.written += chunk.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Complete the object.
    pub async fn finish(self) -> Result<u64, BackupError> {
        let Upload {
            target,
            name,
            writer,
            written,
        } = self;
        writer
            .finish()
            .await
            .map_err(|e| target.error("upload", Some(&name), e))?;
        Ok(written)
    }

    /// Give the upload up: its parts are dropped (S3 `AbortMultipartUpload`,
    /// the staging file removed).
    pub async fn abort(self) -> Result<(), BackupError> {
        let Upload {
            target,
            name,
            writer,
            ..
        } = self;
        writer
            .abort()
            .await
            .map_err(|e| target.error("abort upload", Some(&name), e))
    }
}

/// The endpoint as a URL: k3s's `host[:port]` with the scheme `insecure`
/// says, or a URL that agrees with it.
fn endpoint_url(endpoint: &str, insecure: bool) -> Result<String, String> {
    let endpoint = endpoint.trim();
    if endpoint.is_empty() {
        return Err("is empty".into());
    }
    let scheme = if insecure { "http" } else { "https" };
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("{scheme}://{endpoint}")
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{endpoint:?} is not a host[:port] or URL: {e}"))?;
    match uri.scheme_str() {
        Some(s) if s == scheme => {}
        Some("http") => {
            return Err(format!(
                "{endpoint:?} is plain HTTP; set insecure to use it (TLS is the default)"
            ));
        }
        Some("https") => {
            return Err(format!(
                "{endpoint:?} is HTTPS, but insecure (plain HTTP) is set"
            ));
        }
        _ => return Err(format!("{endpoint:?}: only http and https are supported")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{endpoint:?} has no host"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!(
            "{endpoint:?} has a path; give the bucket and folder in their own fields"
        ));
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// minio-go's automatic bucket lookup, which k3s uses (`BucketLookupAuto`):
/// virtual-hosted style for Amazon's, Google's and Aliyun's endpoints (but a
/// dotted bucket over HTTPS), path style for every other.
fn virtual_hosted(endpoint: &str, bucket: &str) -> bool {
    let Ok(uri) = endpoint.parse::<http::Uri>() else {
        return false;
    };
    let host = uri.host().unwrap_or_default();
    let known = host.ends_with(".amazonaws.com")
        || host.ends_with(".amazonaws.com.cn")
        || host == "storage.googleapis.com"
        || host.ends_with(".aliyuncs.com");
    known && !(uri.scheme_str() == Some("https") && bucket.contains('.'))
}

/// S3's bucket naming rules, the part that matters for a request.
fn check_bucket(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err("is empty".into());
    }
    if bucket.len() < 3 || bucket.len() > 63 {
        return Err(format!("{bucket:?}: a bucket name has 3 to 63 characters"));
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err(format!(
            "{bucket:?}: a bucket name has only lower-case letters, digits, '-' and '.'"
        ));
    }
    Ok(())
}

/// The folder as an object path (k3s joins it with `path.Join`, so leading,
/// trailing and doubled slashes do not matter).
fn folder_path(folder: &str) -> Result<ObjectPath, String> {
    let parts: Vec<&str> = folder.split('/').filter(|p| !p.is_empty()).collect();
    for part in &parts {
        if *part == "." || *part == ".." {
            return Err(format!("{folder:?}: '.' and '..' are not allowed"));
        }
    }
    ObjectPath::parse(parts.join("/")).map_err(|e| format!("{folder:?}: {e}"))
}

/// The certificates of a PEM bundle; at least one, each one parsing.
fn parse_ca(pem: &str) -> Result<Vec<Certificate>, String> {
    let mut certs = Vec::new();
    for (i, block) in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()).enumerate() {
        let block = block.map_err(|e| format!("PEM block {} does not parse: {e}", i + 1))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        block
            .parse_x509()
            .map_err(|e| format!("certificate {} does not parse: {e}", i + 1))?;
        let one = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            base64_lines(&block.contents)
        );
        certs.push(
            Certificate::from_pem(one.as_bytes())
                .map_err(|e| format!("certificate {} is refused: {e}", i + 1))?,
        );
    }
    if certs.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(certs)
}

fn base64_lines(der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    text.as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// An error and its sources, as one line.
fn error_text(err: &(dyn std::error::Error + 'static)) -> String {
    crate::etcd::error::chain_text(err).replace('\n', " ")
}

/// `text` with every credential replaced.
fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_string();
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        text = text.replace(secret.as_str(), "<redacted>");
    }
    text
}

/// The S3 error code (`<Code>InvalidAccessKeyId</Code>`) and message of an
/// error body, when there is one.
fn s3_code(text: &str) -> Option<String> {
    let between = |open: &str, close: &str| {
        let start = text.find(open)? + open.len();
        let end = text[start..].find(close)? + start;
        Some(text[start..end].to_string())
    };
    let code = between("<Code>", "</Code>")?;
    Some(match between("<Message>", "</Message>") {
        Some(message) => format!("{code}: {message}"),
        None => code,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(endpoint: &str, insecure: bool) -> S3Config {
        S3Config {
            endpoint: endpoint.into(),
            bucket: "backups".into(),
            insecure,
            access_key_id: "AKIAEXAMPLE".into(),
            secret_access_key: "very-secret-key".into(),
            ..Default::default()
        }
    }

    fn open_err(config: S3Config) -> String {
        Target::open(&TargetConfig::S3(config))
            .map(|_| ())
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn endpoints_take_the_scheme_insecure_says() {
        let cases = [
            ("minio.local:9000", false, Ok("https://minio.local:9000")),
            ("minio.local:9000", true, Ok("http://minio.local:9000")),
            (
                "https://s3.example.com/",
                false,
                Ok("https://s3.example.com"),
            ),
            ("http://10.0.0.1:9000", true, Ok("http://10.0.0.1:9000")),
            ("http://10.0.0.1:9000", false, Err("plain HTTP")),
            ("https://10.0.0.1:9000", true, Err("insecure")),
            ("", false, Err("is empty")),
            ("minio.local:9000/bucket", false, Err("has a path")),
            ("ftp://x", false, Err("only http and https")),
        ];
        for (endpoint, insecure, expected) in cases {
            match (endpoint_url(endpoint, insecure), expected) {
                (Ok(url), Ok(want)) => assert_eq!(url, want, "{endpoint}"),
                (Err(why), Err(want)) => assert!(why.contains(want), "{endpoint}: {why}"),
                (got, want) => panic!("{endpoint}: {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn bucket_lookup_follows_minio_auto() {
        let cases = [
            ("https://s3.amazonaws.com", "backups", true),
            ("https://s3.eu-west-1.amazonaws.com", "backups", true),
            ("https://s3.amazonaws.com", "my.backups", false),
            ("http://127.0.0.1:9000", "backups", false),
            ("https://minio.example.com", "backups", false),
        ];
        for (endpoint, bucket, expected) in cases {
            assert_eq!(
                virtual_hosted(endpoint, bucket),
                expected,
                "{endpoint} {bucket}"
            );
        }
    }

    #[test]
    fn skipping_tls_verification_is_refused() {
        let mut config = s3("minio.local:9000", false);
        config.skip_tls_verify = true;
        let err = open_err(config);
        assert!(
            err.starts_with("spec.etcdBackup.target.s3.skipTLSVerify:"),
            "{err}"
        );
        assert!(
            err.contains("spec.etcdBackup.target.s3.endpointCA"),
            "{err}"
        );
    }

    #[test]
    fn settings_that_cannot_work_are_refused_naming_the_field() {
        type Case = (fn(&mut S3Config), &'static str);
        let cases: [Case; 6] = [
            (
                |c| c.bucket.clear(),
                "spec.etcdBackup.target.s3.bucket: is empty",
            ),
            (
                |c| c.bucket = "Bad_Bucket".into(),
                "spec.etcdBackup.target.s3.bucket:",
            ),
            (
                |c| c.folder = "a/../b".into(),
                "spec.etcdBackup.target.s3.folder:",
            ),
            (|c| c.access_key_id.clear(), "(access key id): is empty"),
            (
                |c| c.secret_access_key.clear(),
                "(secret access key): is empty",
            ),
            (
                |c| c.endpoint_ca_pem = Some("not a pem".into()),
                "spec.etcdBackup.target.s3.endpointCASecret: holds no PEM certificate",
            ),
        ];
        for (change, expected) in cases {
            let mut config = s3("minio.local:9000", false);
            change(&mut config);
            let err = open_err(config);
            assert!(err.contains(expected), "{err}");
            assert!(!err.contains("very-secret-key"), "{err}");
        }
    }

    #[test]
    fn a_corrupt_ca_certificate_is_refused() {
        let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let mut config = s3("minio.local:9000", false);
        config.endpoint_ca_pem = Some(pem.into());
        let err = open_err(config);
        assert!(
            err.starts_with(
                "spec.etcdBackup.target.s3.endpointCASecret: certificate 1 does not parse"
            ),
            "{err}"
        );
    }

    #[test]
    fn the_cli_names_flags_and_environment() {
        let mut config = s3("minio.local:9000", false);
        config.secret_access_key.clear();
        let err = Target::open_with(&TargetConfig::S3(config), FieldNames::Flags)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("AWS_SECRET_ACCESS_KEY: is empty"), "{err}");
    }

    #[test]
    fn debug_never_shows_credentials() {
        let mut config = s3("minio.local:9000", false);
        config.session_token = Some("session-token-value".into());
        let text = format!("{:?}", TargetConfig::S3(config));
        assert!(
            !text.contains("very-secret-key")
                && !text.contains("session-token-value")
                && !text.contains("AKIAEXAMPLE"),
            "{text}"
        );
    }

    #[test]
    fn folders_are_joined_as_k3s_joins_them() {
        let target = Target::open(&TargetConfig::S3(S3Config {
            folder: "/clusters//prod/".into(),
            ..s3("127.0.0.1:9000", true)
        }))
        .unwrap();
        assert_eq!(
            target.location("capi-scheduled-cp-0-1"),
            "s3://backups/clusters/prod/capi-scheduled-cp-0-1"
        );
        assert_eq!(
            target.describe(),
            "s3://backups/clusters/prod at http://127.0.0.1:9000"
        );
    }

    #[test]
    fn credentials_are_scrubbed_from_error_text() {
        let secrets = vec!["very-secret-key".to_string()];
        assert_eq!(scrub("sig very-secret-key x", &secrets), "sig <redacted> x");
    }
}

#[cfg(test)]
mod abandoned {
    use super::*;

    /// A process killed in the middle of an upload leaves the target's
    /// half-written object behind (a staging file here; parts on S3): it is
    /// never listed (so retention and `list` never count it), and the same
    /// name can be written whole later.
    #[tokio::test]
    async fn an_upload_left_half_way_is_never_listed() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::open(&TargetConfig::Filesystem {
            path: dir.path().to_path_buf(),
        })
        .unwrap();
        let name = "capi-scheduled-cp-0-1765000000";
        let mut upload = target.put(name).await.unwrap();
        upload.write(&vec![7u8; 3 * 1024 * 1024]).await.unwrap();
        // Dropped without finish or abort: what a kill leaves.
        drop(upload);
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        // object_store's staging file, `<name>#<n>`.
        assert!(
            left.iter().any(|f| f.starts_with(&format!("{name}#"))),
            "{left:?}"
        );
        assert!(target.list().await.unwrap().is_empty(), "{left:?}");
        assert!(!target.exists(name).await.unwrap());
        let mut again = target.put(name).await.unwrap();
        again.write(b"whole").await.unwrap();
        again.finish().await.unwrap();
        let listed: Vec<String> = target
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(listed, [name]);
    }
}

//! A real S3 server on loopback for the backup tests: moto's server mode
//! (PyPI `moto[server]`, installed by hack/setup.sh into
//! `.tools/moto-v5.2.6/`), with buckets made and credentials enforced, so
//! that a wrong key or bucket fails as it would on a real endpoint. The
//! server stops when the handle is dropped.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::backup::{S3Config, TargetConfig};

/// The moto release hack/setup.sh pins.
pub const MOTO_VERSION: &str = "5.2.6";

/// Why the server could not be had.
#[derive(Debug, thiserror::Error)]
pub enum MotoError {
    #[error(
        "moto's S3 server is not installed at {0} (run hack/setup.sh, which installs moto[server] {MOTO_VERSION} there; or set MOTO_DIR to a venv with it)"
    )]
    Missing(PathBuf),
    #[error("moto server: {0}")]
    Failed(String),
}

/// A running moto server.
pub struct MotoServer {
    child: Child,
    addr: SocketAddr,
    /// The CA the server's certificate chains to, when it serves HTTPS.
    ca_pem: Option<String>,
    access_key_id: String,
    secret_access_key: String,
    _log: tempfile::TempDir,
}

/// Makes the buckets and an IAM user whose key is allowed everything, then
/// turns moto's authentication on (every later request must be signed with
/// a key it knows), and prints the key.
const SETUP: &str = r#"
import json, sys, urllib.request
import boto3
import os, ssl
url, buckets = sys.argv[1], sys.argv[2:]
ca = os.environ.get("CA_FILE") or None
kw = dict(endpoint_url=url, region_name="us-east-1", verify=ca if ca else True,
          aws_access_key_id="setup", aws_secret_access_key="setup")
s3 = boto3.client("s3", **kw)
for bucket in buckets:
    s3.create_bucket(Bucket=bucket)
iam = boto3.client("iam", **kw)
iam.create_user(UserName="backup")
iam.put_user_policy(UserName="backup", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="backup")["AccessKey"]
# text/plain: moto reads the raw body (a form body would be consumed as a form).
urllib.request.urlopen(urllib.request.Request(url + "/moto-api/reset-auth", data=b"0", method="POST",
                                              headers={"Content-Type": "text/plain"}),
                       context=ssl.create_default_context(cafile=ca) if ca else None).read()
print(json.dumps({"id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}))
"#;

fn moto_dir() -> PathBuf {
    std::env::var_os("MOTO_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join(".tools")
                .join(format!("moto-v{MOTO_VERSION}"))
        })
}

impl MotoServer {
    /// Start a server on a free loopback port with `buckets` made.
    pub fn start(buckets: &[&str]) -> Result<MotoServer, MotoError> {
        Self::start_with(buckets, None)
    }

    /// [`Self::start`], serving HTTPS with a certificate for 127.0.0.1
    /// issued by `ca`.
    pub fn start_tls(
        buckets: &[&str],
        ca: &crate::harness::TestCa,
    ) -> Result<MotoServer, MotoError> {
        Self::start_with(buckets, Some(ca))
    }

    fn start_with(
        buckets: &[&str],
        ca: Option<&crate::harness::TestCa>,
    ) -> Result<MotoServer, MotoError> {
        let dir = moto_dir();
        let server = dir.join("bin").join("moto_server");
        let python = dir.join("bin").join("python");
        if !server.is_file() || !python.is_file() {
            return Err(MotoError::Missing(dir));
        }
        let failed = |what: String| MotoError::Failed(what);
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| failed(format!("no free port: {e}")))?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = tempfile::tempdir().map_err(|e| failed(e.to_string()))?;
        let log_file = std::fs::File::create(log.path().join("moto.log"))
            .map_err(|e| failed(e.to_string()))?;
        let mut command = Command::new(&server);
        command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let mut ca_file = None;
        if let Some(ca) = ca {
            let serving = ca.issue(
                "moto",
                &[rcgen::SanType::IpAddress(std::net::IpAddr::V4(
                    std::net::Ipv4Addr::LOCALHOST,
                ))],
                &[rcgen::ExtendedKeyUsagePurpose::ServerAuth],
            );
            let write = |name: &str, pem: &str| {
                let path = log.path().join(name);
                std::fs::write(&path, pem)
                    .map(|_| path)
                    .map_err(|e| failed(e.to_string()))
            };
            command
                .arg("--ssl-cert")
                .arg(write("server.crt", &serving.cert_pem)?)
                .arg("--ssl-key")
                .arg(write("server.key", &serving.key_pem)?);
            ca_file = Some(write("ca.crt", &ca.pair.cert_pem)?);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(|e| failed(e.to_string()))?)
            .stderr(log_file)
            .spawn()
            .map_err(|e| failed(format!("{}: {e}", server.display())))?;
        let mut moto = MotoServer {
            child,
            addr,
            ca_pem: ca.map(|ca| ca.pair.cert_pem.clone()),
            access_key_id: String::new(),
            secret_access_key: String::new(),
            _log: log,
        };
        moto.wait_listening(Duration::from_secs(30))?;
        let out = Command::new(&python)
            .arg("-c")
            .arg(SETUP)
            .arg(moto.url())
            .args(buckets)
            .env(
                "CA_FILE",
                ca_file.as_deref().unwrap_or(std::path::Path::new("")),
            )
            .output()
            .map_err(|e| failed(format!("{}: {e}", python.display())))?;
        if !out.status.success() {
            return Err(failed(format!(
                "setting up buckets and credentials failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let key: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| failed(format!("setup printed no key: {e}")))?;
        moto.access_key_id = key["id"].as_str().unwrap_or_default().to_string();
        moto.secret_access_key = key["secret"].as_str().unwrap_or_default().to_string();
        Ok(moto)
    }

    /// Poll until the port accepts connections (or the process died).
    fn wait_listening(&mut self, limit: Duration) -> Result<(), MotoError> {
        let deadline = Instant::now() + limit;
        loop {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(MotoError::Failed(format!(
                    "exited early ({status}): {}",
                    self.log()
                )));
            }
            if Instant::now() >= deadline {
                return Err(MotoError::Failed(format!(
                    "not listening on {} after {limit:?}: {}",
                    self.addr,
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._log.path().join("moto.log")).unwrap_or_default()
    }

    /// `http://127.0.0.1:<port>` (`https://` when it serves TLS).
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// `127.0.0.1:<port>`, as k3s's `--etcd-s3-endpoint` takes it.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }

    pub fn secret_access_key(&self) -> &str {
        &self.secret_access_key
    }

    /// A target on `bucket`/`folder` of this server, with its credentials
    /// (and its CA when it serves TLS).
    pub fn target(&self, bucket: &str, folder: &str) -> TargetConfig {
        TargetConfig::S3(S3Config {
            endpoint: self.endpoint(),
            bucket: bucket.to_string(),
            folder: folder.to_string(),
            region: String::new(),
            insecure: self.ca_pem.is_none(),
            skip_tls_verify: false,
            endpoint_ca_pem: self.ca_pem.clone(),
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            session_token: None,
        })
    }
}

/// One S3 call with the server's key: `list-uploads` prints the multipart
/// uploads in progress in a bucket, one key a line; `create-bucket` makes one.
const S3_CALL: &str = r#"
import os, sys
import boto3
url, op, bucket = sys.argv[1], sys.argv[2], sys.argv[3]
ca = os.environ.get("CA_FILE")
s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                  verify=ca if ca and os.path.exists(ca) else True,
                  aws_access_key_id=os.environ["KEY_ID"], aws_secret_access_key=os.environ["KEY_SECRET"])
if op == "create-bucket":
    s3.create_bucket(Bucket=bucket)
else:
    for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        print(upload["Key"])
"#;

impl MotoServer {
    /// The keys of the multipart uploads begun in `bucket` and neither
    /// completed nor aborted (S3 `ListMultipartUploads`): what a failed
    /// upload that was not aborted leaves behind, invisible to a listing.
    pub fn multipart_uploads(&self, bucket: &str) -> Result<Vec<String>, MotoError> {
        Ok(self
            .s3_call("list-uploads", bucket)?
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// Make `bucket` (a target that failed for want of it works again).
    pub fn create_bucket(&self, bucket: &str) -> Result<(), MotoError> {
        self.s3_call("create-bucket", bucket).map(|_| ())
    }

    fn s3_call(&self, op: &str, bucket: &str) -> Result<String, MotoError> {
        let python = moto_dir().join("bin").join("python");
        let out = Command::new(&python)
            .arg("-c")
            .arg(S3_CALL)
            .env("CA_FILE", self._log.path().join("ca.crt"))
            .arg(self.url())
            .arg(op)
            .arg(bucket)
            .env("KEY_ID", &self.access_key_id)
            .env("KEY_SECRET", &self.secret_access_key)
            .output()
            .map_err(|e| MotoError::Failed(format!("{}: {e}", python.display())))?;
        if !out.status.success() {
            return Err(MotoError::Failed(format!(
                "{op} {bucket} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

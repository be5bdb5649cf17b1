//! Object storage for what is large and written once: symbol files and their
//! indexes (SysOM-AI §3.4) and raw uploads kept for reprocessing. One
//! interface over a local directory (the embedded default) and any
//! S3-compatible store (AWS S3, MinIO, SeaweedFS), both through the
//! `object_store` crate; [`conformance`] checks either.
//!
//! The server's handlers call storage from blocking threads, so this is a
//! blocking facade over object_store's async API, run on a small runtime of
//! its own (its connections live there, not on the HTTP server's workers).

use std::path::PathBuf;
use std::sync::Arc;

use futures_util::TryStreamExt;

use crate::StoreError;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

impl From<object_store::Error> for StoreError {
    fn from(e: object_store::Error) -> Self {
        let mut msg = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            let text = c.to_string();
            if !msg.contains(&text) {
                msg.push_str(": ");
                msg.push_str(&text);
            }
            cause = c.source();
        }
        StoreError::Backend(format!("object store: {msg}"))
    }
}

/// Where objects live, as `--object-store` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectLocation {
    /// A local directory (created).
    Dir(PathBuf),
    /// `s3://bucket[/prefix]`, with an optional endpoint for S3-compatible
    /// servers (path-style requests; plain HTTP allowed for `http://`).
    /// Credentials and region come from the usual `AWS_*` variables; with
    /// none, requests are unsigned (a public or anonymous bucket).
    S3 {
        /// Bucket name.
        bucket: String,
        /// Key prefix inside the bucket (no leading or trailing `/`).
        prefix: String,
        /// `http(s)://host:port` of an S3-compatible server.
        endpoint: Option<String>,
    },
}

impl ObjectLocation {
    /// Parses `s3://bucket/prefix`, `file:///dir` or a plain directory path.
    pub fn parse(url: &str, endpoint: Option<&str>) -> Result<Self, StoreError> {
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StoreError::Config(format!(
                    "object store {url:?}: expected s3://BUCKET[/PREFIX]"
                )));
            }
            return Ok(ObjectLocation::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.trim_matches('/').to_string(),
                endpoint: endpoint.map(str::to_string),
            });
        }
        if endpoint.is_some() {
            return Err(StoreError::Config(format!(
                "object store {url:?}: an endpoint is only for s3:// locations"
            )));
        }
        let dir = url.strip_prefix("file://").unwrap_or(url);
        if dir.is_empty() || url.contains("://") && !url.starts_with("file://") {
            return Err(StoreError::Config(format!(
                "object store {url:?}: expected s3://BUCKET[/PREFIX], file:///DIR or a directory"
            )));
        }
        Ok(ObjectLocation::Dir(PathBuf::from(dir)))
    }
}

impl std::fmt::Display for ObjectLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectLocation::Dir(d) => write!(f, "{}", d.display()),
            ObjectLocation::S3 {
                bucket,
                prefix,
                endpoint,
            } => {
                write!(f, "s3://{bucket}/{prefix}")?;
                if let Some(e) = endpoint {
                    write!(f, " at {e}")?;
                }
                Ok(())
            }
        }
    }
}

/// A blocking object store: put, get, list and delete whole objects.
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    /// Key prefix (S3) prepended to every key.
    prefix: String,
    /// The directory, for a local store: its files can be mapped in place.
    dir: Option<PathBuf>,
    rt: Option<tokio::runtime::Runtime>,
    location: ObjectLocation,
}

impl Objects {
    /// Opens (and for a directory, creates) the store.
    pub fn open(location: &ObjectLocation) -> Result<Self, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("whyslow-objects")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Config(format!("object store runtime: {e}")))?;
        let (store, prefix, dir): (Arc<dyn ObjectStore>, String, Option<PathBuf>) = match location {
            ObjectLocation::Dir(d) => {
                std::fs::create_dir_all(d).map_err(|e| {
                    StoreError::Config(format!("object store {}: {e}", d.display()))
                })?;
                let d = d.canonicalize().map_err(|e| {
                    StoreError::Config(format!("object store {}: {e}", d.display()))
                })?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&d)?
                    .with_automatic_cleanup(true);
                (Arc::new(fs), String::new(), Some(d))
            }
            ObjectLocation::S3 {
                bucket,
                prefix,
                endpoint,
            } => {
                // HTTPS goes through reqwest's rustls with the process's
                // provider: ring, as for the server's own TLS.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
                if std::env::var_os("AWS_REGION").is_none()
                    && std::env::var_os("AWS_DEFAULT_REGION").is_none()
                {
                    b = b.with_region("us-east-1");
                }
                // An upload waits on this store: a few quick retries, then
                // the client is told to retry later (503), not held minutes.
                b = b
                    .with_retry(object_store::RetryConfig {
                        max_retries: 3,
                        retry_timeout: std::time::Duration::from_secs(15),
                        ..Default::default()
                    })
                    .with_client_options(
                        object_store::ClientOptions::new()
                            .with_connect_timeout(std::time::Duration::from_secs(5))
                            .with_timeout(std::time::Duration::from_secs(120)),
                    );
                // After the client options: allow_http is one of them.
                if let Some(e) = endpoint {
                    b = b
                        .with_endpoint(e)
                        .with_allow_http(e.starts_with("http://"))
                        .with_virtual_hosted_style_request(false);
                }
                if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
                    b = b.with_skip_signature(true);
                }
                (Arc::new(b.build()?), prefix.clone(), None)
            }
        };
        Ok(Objects {
            store,
            prefix,
            dir,
            rt: Some(rt),
            location: location.clone(),
        })
    }

    /// Where the objects are.
    pub fn location(&self) -> &ObjectLocation {
        &self.location
    }

    fn path(&self, key: &str) -> Result<ObjectPath, StoreError> {
        let full = if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        };
        ObjectPath::parse(&full)
            .map_err(|e| StoreError::BadName(format!("object key {key:?}: {e}")))
    }

    fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt
            .as_ref()
            .expect("runtime lives until drop")
            .block_on(f)
    }

    /// Writes one object (atomically: readers see the old or the new one).
    pub fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let p = self.path(key)?;
        self.run(self.store.put(&p, PutPayload::from(bytes)))?;
        Ok(())
    }

    /// Reads one object; `None` when there is none.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let p = self.path(key)?;
        self.run(async {
            match self.store.get(&p).await {
                Ok(r) => Ok(Some(r.bytes().await?.to_vec())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// Whether an object exists.
    pub fn exists(&self, key: &str) -> Result<bool, StoreError> {
        let p = self.path(key)?;
        self.run(async {
            match self.store.head(&p).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// The keys under `prefix/` (the full key, sorted), with their sizes.
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let p = self.path(prefix)?;
        let skip = if self.prefix.is_empty() {
            0
        } else {
            self.prefix.len() + 1
        };
        let mut out: Vec<(String, u64)> = self.run(
            self.store
                .list(Some(&p))
                .map_ok(|m| (m.location.to_string(), m.size))
                .try_collect(),
        )?;
        for (k, _) in out.iter_mut() {
            *k = k.get(skip..).unwrap_or_default().to_string();
        }
        out.sort();
        Ok(out)
    }

    /// Deletes one object (none there is not an error).
    pub fn delete(&self, key: &str) -> Result<(), StoreError> {
        let p = self.path(key)?;
        self.run(async {
            match self.store.delete(&p).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// The file that holds an object, for a local store (so an index can be
    /// mapped in place instead of copied).
    pub fn local_file(&self, key: &str) -> Option<PathBuf> {
        let d = self.dir.as_ref()?;
        self.path(key).ok()?;
        Some(d.join(key))
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        // Dropping a runtime inside another one's async context panics; a
        // background shutdown never does.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Checks an object store: round trips, listing by prefix (and only that
/// prefix), overwrite, delete, binary content, missing keys. What
/// `whyslow server check-store --object-store` runs.
pub fn conformance(o: &Objects) -> Result<(), String> {
    let base = format!(
        "conformance-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let e = |what: &str, err: StoreError| format!("{what}: {err}");
    let check = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
    let binary: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    o.put(&format!("{base}/a/1"), binary.clone())
        .map_err(|x| e("put", x))?;
    o.put(&format!("{base}/a/2"), b"two".to_vec())
        .map_err(|x| e("put", x))?;
    o.put(&format!("{base}/ab/1"), b"other prefix".to_vec())
        .map_err(|x| e("put", x))?;
    check(
        o.get(&format!("{base}/a/1")).map_err(|x| e("get", x))? == Some(binary),
        "a 300 kB binary object did not read back the same",
    )?;
    check(
        o.get(&format!("{base}/a/3"))
            .map_err(|x| e("get", x))?
            .is_none(),
        "a missing object read back as present",
    )?;
    check(
        !o.exists(&format!("{base}/a/3")).map_err(|x| e("head", x))?,
        "a missing object exists",
    )?;
    let listed = o.list(&format!("{base}/a")).map_err(|x| e("list", x))?;
    let keys: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
    check(
        keys == [format!("{base}/a/1"), format!("{base}/a/2")],
        &format!("listing {base}/a gave {keys:?} (expected a/1 and a/2 only, not ab/1)"),
    )?;
    check(
        listed[0].1 == 300_000 && listed[1].1 == 3,
        "listed sizes are wrong",
    )?;
    o.put(&format!("{base}/a/2"), b"second".to_vec())
        .map_err(|x| e("overwrite", x))?;
    check(
        o.get(&format!("{base}/a/2")).map_err(|x| e("get", x))? == Some(b"second".to_vec()),
        "an overwritten object kept its old content",
    )?;
    for k in ["a/1", "a/2", "ab/1"] {
        o.delete(&format!("{base}/{k}"))
            .map_err(|x| e("delete", x))?;
    }
    o.delete(&format!("{base}/a/1"))
        .map_err(|x| e("deleting a deleted object", x))?;
    check(
        o.list(&base).map_err(|x| e("list", x))?.is_empty(),
        "objects remained after delete",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse() {
        assert_eq!(
            ObjectLocation::parse("s3://b/p/q/", Some("http://h:1")).unwrap(),
            ObjectLocation::S3 {
                bucket: "b".into(),
                prefix: "p/q".into(),
                endpoint: Some("http://h:1".into())
            }
        );
        assert_eq!(
            ObjectLocation::parse("file:///x/y", None).unwrap(),
            ObjectLocation::Dir("/x/y".into())
        );
        assert!(ObjectLocation::parse("s3://", None).is_err());
        assert!(ObjectLocation::parse("gs://b", None).is_err());
        assert!(ObjectLocation::parse("/d", Some("http://h")).is_err());
    }

    #[test]
    fn a_local_directory_passes_the_conformance_checks() {
        let d = std::env::temp_dir().join(format!("whyslow-objects-{}", std::process::id()));
        let o = Objects::open(&ObjectLocation::Dir(d.clone())).unwrap();
        conformance(&o).unwrap();
        assert!(o.path("../x").is_err() || o.local_file("../x").is_none());
        let _ = std::fs::remove_dir_all(&d);
    }
}

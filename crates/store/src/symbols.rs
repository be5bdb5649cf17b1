//! The symbol store (SysOM-AI §3.4): ELF files uploaded once per tenant and
//! Build-ID, in parts of at most 64 MiB, turned into a symbol index
//! (`whyslow_stacks::symindex`) when the last part arrives; the parts and
//! the ELF file are then deleted, only the index is kept. Profiles are
//! symbolized when they are read: a native frame that came without a name
//! (a stripped binary on the node) gets one from its Build-ID's index, so
//! symbols uploaded after the profiles still apply.
//!
//! Objects (a local directory by default, S3-compatible storage at scale):
//! `t<tenant>/<build-id>/part-<n>-of-<m>` while parts arrive, then
//! `t<tenant>/<build-id>/index`. Tenants never see each other's symbols
//! (the tenant is part of every key). An index in a local directory is
//! mapped in place; one in object storage is fetched once into a local
//! cache and mapped from there, so a lookup never reads a whole file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use whyslow_model::stack::{FrameKind, StackProfile};
use whyslow_stacks::elf::Segment;
use whyslow_stacks::symindex::{build_index, SymbolIndex};

use crate::objects::Objects;
use crate::StoreError;
use crate::TenantId;

/// Largest part of an upload.
pub const MAX_PART_BYTES: usize = 64 << 20;
/// Most parts of one file (64 GiB at the largest part size).
pub const MAX_PARTS: u32 = 1024;
/// How long a Build-ID found missing is not asked for again (a profile read
/// would otherwise ask object storage once per unnamed frame).
const MISSING_FOR: Duration = Duration::from_secs(30);

/// What a part upload achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartStatus {
    /// Parts received so far, of how many.
    Waiting { received: u32, of: u32 },
    /// The file is complete and indexed: how many symbols.
    Indexed { symbols: u64 },
}

/// Symbol indexes in object storage.
pub struct SymbolStore {
    objects: Arc<Objects>,
    /// Key prefix inside `objects` (empty, or `symbols` in a shared bucket).
    prefix: String,
    /// Local copies of remote indexes, and scratch space for assembling.
    cache: PathBuf,
    /// Opened indexes (mapped read-only), by (tenant, Build-ID).
    open: Mutex<HashMap<(i64, String), Arc<memmap2::Mmap>>>,
    /// Build-IDs found without an index, and when.
    missing: Mutex<HashMap<(i64, String), Instant>>,
    /// One file assembled at a time.
    assembling: Mutex<()>,
}

/// Checks a Build-ID: 2–128 lowercase hex digits.
pub fn check_build_id(id: &str) -> Result<(), StoreError> {
    if (2..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(StoreError::BadName(format!(
            "Build-ID {id:?}: expected 2-128 lowercase hex digits"
        )))
    }
}

fn io(p: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("symbol store {}", p.display()), e)
}

impl SymbolStore {
    /// A store in a local directory (created): the embedded default.
    pub fn open(root: &Path) -> Result<Self, StoreError> {
        let objects = Objects::open(&crate::objects::ObjectLocation::Dir(root.to_path_buf()))?;
        Self::with_objects(Arc::new(objects), "", &root.join(".cache"))
    }

    /// A store under `prefix` in `objects`, with local copies of its
    /// indexes in `cache` (created).
    pub fn with_objects(
        objects: Arc<Objects>,
        prefix: &str,
        cache: &Path,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(cache).map_err(|e| io(cache, e))?;
        Ok(SymbolStore {
            objects,
            prefix: prefix.trim_matches('/').to_string(),
            cache: cache.to_path_buf(),
            open: Mutex::new(HashMap::new()),
            missing: Mutex::new(HashMap::new()),
            assembling: Mutex::new(()),
        })
    }

    fn key(&self, tenant: TenantId, build_id: &str, name: &str) -> String {
        let k = format!("t{}/{build_id}/{name}", tenant.0);
        if self.prefix.is_empty() {
            k
        } else {
            format!("{}/{k}", self.prefix)
        }
    }

    /// Stores part `part` (0-based) of `of`; when all are there, joins them,
    /// checks that the file is an ELF file with this Build-ID, and indexes it
    /// — with `layout`, the load segments of the program a separate debug
    /// file belongs to, given with the part that completes the file.
    pub fn put_part(
        &self,
        tenant: TenantId,
        build_id: &str,
        part: u32,
        of: u32,
        bytes: &[u8],
        layout: Option<&[Segment]>,
    ) -> Result<PartStatus, StoreError> {
        check_build_id(build_id)?;
        if of == 0 || of > MAX_PARTS || part >= of {
            return Err(StoreError::BadName(format!(
                "part {part} of {of}: expected 0 <= part < of <= {MAX_PARTS}"
            )));
        }
        if bytes.len() > MAX_PART_BYTES {
            return Err(StoreError::BadName(format!(
                "a part holds at most {MAX_PART_BYTES} bytes, not {}",
                bytes.len()
            )));
        }
        if let Some(n) = self.symbols(tenant, build_id)? {
            return Ok(PartStatus::Indexed { symbols: n });
        }
        let part_name = |i: u32| format!("part-{i}-of-{of}");
        self.objects.put(
            &self.key(tenant, build_id, &part_name(part)),
            bytes.to_vec(),
        )?;
        let dir = self.key(tenant, build_id, "");
        let present: std::collections::HashSet<String> = self
            .objects
            .list(dir.trim_end_matches('/'))?
            .into_iter()
            .filter_map(|(k, _)| k.rsplit('/').next().map(str::to_string))
            .collect();
        let received = (0..of).filter(|i| present.contains(&part_name(*i))).count() as u32;
        if received < of {
            return Ok(PartStatus::Waiting { received, of });
        }
        let _one = self.assembling.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = self.symbols(tenant, build_id)? {
            return Ok(PartStatus::Indexed { symbols: n });
        }
        let elf = self
            .cache
            .join(format!(".assemble-t{}-{build_id}", tenant.0));
        let cleanup = |elf: &Path| {
            for i in 0..of {
                let _ = self
                    .objects
                    .delete(&self.key(tenant, build_id, &part_name(i)));
            }
            let _ = std::fs::remove_file(elf);
        };
        {
            use std::io::Write;
            let mut out = std::fs::File::create(&elf).map_err(|e| io(&elf, e))?;
            for i in 0..of {
                let k = self.key(tenant, build_id, &part_name(i));
                let Some(b) = self.objects.get(&k)? else {
                    let _ = std::fs::remove_file(&elf);
                    return Ok(PartStatus::Waiting { received: i, of });
                };
                out.write_all(&b).map_err(|e| io(&elf, e))?;
            }
        }
        let (index, summary) = match build_index(&elf, layout) {
            Ok(x) => x,
            Err(e) => {
                cleanup(&elf);
                return Err(StoreError::BadName(format!(
                    "the uploaded file is not a readable ELF file: {e}"
                )));
            }
        };
        if summary.build_id.as_deref() != Some(build_id) {
            cleanup(&elf);
            return Err(StoreError::BadName(format!(
                "the uploaded file's Build-ID is {:?}, not {build_id}",
                summary.build_id
            )));
        }
        self.objects
            .put(&self.key(tenant, build_id, "index"), index)?;
        cleanup(&elf);
        self.missing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(tenant.0, build_id.to_string()));
        Ok(PartStatus::Indexed {
            symbols: summary.symbols,
        })
    }

    /// The index file to map: in place for a local store, else a local copy
    /// fetched once.
    fn index_file(&self, tenant: TenantId, build_id: &str) -> Result<Option<PathBuf>, StoreError> {
        let key = self.key(tenant, build_id, "index");
        if let Some(p) = self.objects.local_file(&key) {
            return Ok(p.is_file().then_some(p));
        }
        let copy = self.cache.join(format!("t{}-{build_id}.index", tenant.0));
        if copy.is_file() {
            return Ok(Some(copy));
        }
        let Some(bytes) = self.objects.get(&key)? else {
            return Ok(None);
        };
        let tmp = self
            .cache
            .join(format!(".t{}-{build_id}.{}", tenant.0, std::process::id()));
        std::fs::write(&tmp, bytes).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &copy).map_err(|e| io(&copy, e))?;
        Ok(Some(copy))
    }

    fn index(
        &self,
        tenant: TenantId,
        build_id: &str,
    ) -> Result<Option<Arc<memmap2::Mmap>>, StoreError> {
        let key = (tenant.0, build_id.to_string());
        if let Some(m) = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(Some(m.clone()));
        }
        {
            let mut missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
            match missing.get(&key) {
                Some(t) if t.elapsed() < MISSING_FOR => return Ok(None),
                Some(_) => {
                    missing.remove(&key);
                }
                None => {}
            }
        }
        let Some(path) = self.index_file(tenant, build_id)? else {
            let mut missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
            if missing.len() > 65_536 {
                missing.clear();
            }
            missing.insert(key, Instant::now());
            return Ok(None);
        };
        let f = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
        // SAFETY: read-only map of a file written once and renamed into
        // place, never rewritten.
        let m = Arc::new(unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io(&path, e))?);
        if SymbolIndex::parse(&m).is_err() {
            return Ok(None);
        }
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() > 4096 {
            open.clear();
        }
        open.insert(key, m.clone());
        Ok(Some(m))
    }

    /// Symbols indexed for this Build-ID, or `None` when it was not uploaded.
    pub fn symbols(&self, tenant: TenantId, build_id: &str) -> Result<Option<u64>, StoreError> {
        check_build_id(build_id)?;
        Ok(self
            .index(tenant, build_id)?
            .and_then(|m| SymbolIndex::parse(&m).ok().map(|i| i.len() as u64)))
    }

    /// Names the native frames of `profile` that came without a name, from
    /// the tenant's indexes; returns how many frames were named.
    pub fn symbolize(&self, tenant: TenantId, profile: &mut StackProfile) -> usize {
        let mut named = 0;
        for f in profile.frames.iter_mut() {
            if f.kind != FrameKind::Native || f.name.is_some() {
                continue;
            }
            let Some(id) = f.build_id.as_deref() else {
                continue;
            };
            if check_build_id(id).is_err() {
                continue;
            }
            let Ok(Some(m)) = self.index(tenant, id) else {
                continue;
            };
            if let Some(name) = SymbolIndex::parse(&m)
                .ok()
                .and_then(|i| i.name_at_offset(f.offset))
            {
                f.name = Some(name.to_string());
                named += 1;
            }
        }
        named
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_and_part_numbers_are_checked() {
        assert!(check_build_id("0a1b").is_ok());
        for bad in ["", "x", "0A1B", "../ab", &"a".repeat(129)] {
            assert!(check_build_id(bad).is_err(), "{bad:?}");
        }
        let d = std::env::temp_dir().join(format!("whyslow-sym-{}", std::process::id()));
        let s = SymbolStore::open(&d).unwrap();
        let t = TenantId(1);
        assert!(s.put_part(t, "abcd", 1, 1, b"x", None).is_err());
        assert!(s.put_part(t, "abcd", 0, 0, b"x", None).is_err());
        assert!(s.put_part(t, "abcd", 0, MAX_PARTS + 1, b"x", None).is_err());
        // Not an ELF file: refused, nothing kept.
        let e = s
            .put_part(t, "abcd", 0, 1, b"not an elf", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a readable ELF"), "{e}");
        assert_eq!(s.symbols(t, "abcd").unwrap(), None);
        let _ = std::fs::remove_dir_all(&d);
    }
}

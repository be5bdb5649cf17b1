//! The symbol store (SysOM-AI §3.4): ELF files uploaded once per tenant and
//! Build-ID, in parts of at most 64 MiB, turned into a symbol index
//! (`whyslow_stacks::symindex`) when the last part arrives; the parts and
//! the ELF file are then deleted, only the index is kept. Profiles are
//! symbolized when they are read: a native frame that came without a name
//! (a stripped binary on the node) gets one from its Build-ID's index, so
//! symbols uploaded after the profiles still apply.
//!
//! On disk: `ROOT/t<tenant>/<build-id>/part-<n>-of-<m>` while parts arrive,
//! then `ROOT/t<tenant>/<build-id>/index`. Tenants never see each other's
//! symbols (the tenant is part of every path).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use whyslow_model::stack::{FrameKind, StackProfile};
use whyslow_stacks::symindex::{build_index, SymbolIndex};

use crate::store::TenantId;

/// Largest part of an upload.
pub const MAX_PART_BYTES: usize = 64 << 20;
/// Most parts of one file (64 GiB at the largest part size).
pub const MAX_PARTS: u32 = 1024;

/// What a part upload achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartStatus {
    /// Parts received so far, of how many.
    Waiting { received: u32, of: u32 },
    /// The file is complete and indexed: how many symbols.
    Indexed { symbols: u64 },
}

/// Why a symbol upload or lookup failed.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// The request itself is wrong (Build-ID, part numbers, the file).
    #[error("{0}")]
    Bad(String),
    /// The disk failed.
    #[error("symbol store {0}: {1}")]
    Io(String, std::io::Error),
}

/// Symbol indexes on local disk.
pub struct SymbolStore {
    root: PathBuf,
    /// Opened indexes (mapped read-only), by (tenant, Build-ID).
    open: Mutex<HashMap<(i64, String), Arc<memmap2::Mmap>>>,
    /// One file assembled at a time.
    assembling: Mutex<()>,
}

/// Checks a Build-ID: 2–128 lowercase hex digits.
pub fn check_build_id(id: &str) -> Result<(), SymbolError> {
    if (2..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(SymbolError::Bad(format!(
            "Build-ID {id:?}: expected 2-128 lowercase hex digits"
        )))
    }
}

fn io(p: &Path, e: std::io::Error) -> SymbolError {
    SymbolError::Io(p.display().to_string(), e)
}

impl SymbolStore {
    /// A store in `root` (created).
    pub fn open(root: &Path) -> Result<Self, SymbolError> {
        std::fs::create_dir_all(root).map_err(|e| io(root, e))?;
        Ok(SymbolStore {
            root: root.to_path_buf(),
            open: Mutex::new(HashMap::new()),
            assembling: Mutex::new(()),
        })
    }

    fn dir(&self, tenant: TenantId, build_id: &str) -> PathBuf {
        self.root.join(format!("t{}", tenant.0)).join(build_id)
    }

    /// Stores part `part` (0-based) of `of`; when all are there, joins them,
    /// checks that the file is an ELF file with this Build-ID, and indexes it.
    pub fn put_part(
        &self,
        tenant: TenantId,
        build_id: &str,
        part: u32,
        of: u32,
        bytes: &[u8],
    ) -> Result<PartStatus, SymbolError> {
        check_build_id(build_id)?;
        if of == 0 || of > MAX_PARTS || part >= of {
            return Err(SymbolError::Bad(format!(
                "part {part} of {of}: expected 0 <= part < of <= {MAX_PARTS}"
            )));
        }
        if bytes.len() > MAX_PART_BYTES {
            return Err(SymbolError::Bad(format!(
                "a part holds at most {MAX_PART_BYTES} bytes, not {}",
                bytes.len()
            )));
        }
        let dir = self.dir(tenant, build_id);
        if let Some(n) = self.symbols(tenant, build_id)? {
            return Ok(PartStatus::Indexed { symbols: n });
        }
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        let path = dir.join(format!("part-{part}-of-{of}"));
        let tmp = dir.join(format!(".part-{part}-of-{of}.{}", std::process::id()));
        std::fs::write(&tmp, bytes).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        let received = (0..of)
            .filter(|i| dir.join(format!("part-{i}-of-{of}")).is_file())
            .count() as u32;
        if received < of {
            return Ok(PartStatus::Waiting { received, of });
        }
        let _one = self.assembling.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = self.symbols(tenant, build_id)? {
            return Ok(PartStatus::Indexed { symbols: n });
        }
        let elf = dir.join("elf");
        {
            use std::io::Write;
            let mut out = std::fs::File::create(&elf).map_err(|e| io(&elf, e))?;
            for i in 0..of {
                let p = dir.join(format!("part-{i}-of-{of}"));
                let b = std::fs::read(&p).map_err(|e| io(&p, e))?;
                out.write_all(&b).map_err(|e| io(&elf, e))?;
            }
        }
        let cleanup = |dir: &Path| {
            for i in 0..of {
                let _ = std::fs::remove_file(dir.join(format!("part-{i}-of-{of}")));
            }
            let _ = std::fs::remove_file(dir.join("elf"));
        };
        let built = build_index(&elf);
        let (index, summary) = match built {
            Ok(x) => x,
            Err(e) => {
                cleanup(&dir);
                return Err(SymbolError::Bad(format!(
                    "the uploaded file is not a readable ELF file: {e}"
                )));
            }
        };
        if summary.build_id.as_deref() != Some(build_id) {
            cleanup(&dir);
            return Err(SymbolError::Bad(format!(
                "the uploaded file's Build-ID is {:?}, not {build_id}",
                summary.build_id
            )));
        }
        let tmp = dir.join(".index.tmp");
        std::fs::write(&tmp, &index).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, dir.join("index")).map_err(|e| io(&dir, e))?;
        cleanup(&dir);
        Ok(PartStatus::Indexed {
            symbols: summary.symbols,
        })
    }

    fn index(&self, tenant: TenantId, build_id: &str) -> Option<Arc<memmap2::Mmap>> {
        let key = (tenant.0, build_id.to_string());
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = open.get(&key) {
            return Some(m.clone());
        }
        let f = std::fs::File::open(self.dir(tenant, build_id).join("index")).ok()?;
        // SAFETY: read-only map of a file this store wrote once and renames
        // into place, never rewrites.
        let m = Arc::new(unsafe { memmap2::Mmap::map(&f) }.ok()?);
        SymbolIndex::parse(&m).ok()?;
        if open.len() > 4096 {
            open.clear();
        }
        open.insert(key, m.clone());
        Some(m)
    }

    /// Symbols indexed for this Build-ID, or `None` when it was not uploaded.
    pub fn symbols(&self, tenant: TenantId, build_id: &str) -> Result<Option<u64>, SymbolError> {
        check_build_id(build_id)?;
        Ok(self
            .index(tenant, build_id)
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
            let Some(m) = self.index(tenant, id) else {
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
        assert!(s.put_part(t, "abcd", 1, 1, b"x").is_err());
        assert!(s.put_part(t, "abcd", 0, 0, b"x").is_err());
        assert!(s.put_part(t, "abcd", 0, MAX_PARTS + 1, b"x").is_err());
        // Not an ELF file: refused, nothing kept.
        let e = s
            .put_part(t, "abcd", 0, 1, b"not an elf")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a readable ELF"), "{e}");
        assert_eq!(s.symbols(t, "abcd").unwrap(), None);
        let _ = std::fs::remove_dir_all(&d);
    }
}

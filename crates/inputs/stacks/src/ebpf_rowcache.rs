//! Compiled unwind rows kept on disk by Build-ID, so that a module's
//! `.eh_frame` is compiled once per machine rather than at every start of
//! `whyslow profile` or the agent (issue 48: libtorch_cpu.so's 2.7 M rows
//! were most of the eBPF engine's start-up, paid inside the profiled
//! period). A module without a Build-ID is compiled every time, as before.
//!
//! A file per module, `<dir>/cfi-v1/<build-id>.rows`: a 16-byte header
//! (magic, row count) and the rows as the kernel's array holds them. Files
//! are written to a temporary name and renamed, so a reader never sees half
//! of one; one that does not read back whole is ignored (and compiled
//! again). The directory is capped: past [`CAP_BYTES`] the least recently
//! written files go first. The directory: `$WHYSLOW_CACHE_DIR` (empty:
//! no cache), else `$XDG_CACHE_HOME/whyslow`, else `~/.cache/whyslow`.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Bytes the cache may hold on disk.
pub const CAP_BYTES: u64 = 1 << 30;
/// First bytes of a rows file; the last byte is the format's version.
const MAGIC: [u8; 8] = *b"WSCFIR\0\x01";
/// Bytes of one row: pc u32, cfa u8, rbp u8, pad u16, cfa_offset i32,
/// rbp_offset i32, little-endian.
pub const ROW_BYTES: usize = 16;

/// One row as the cache stores it (the BPF program's `cfi_row`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CachedRow {
    /// Start of the row's range, as an offset in the module.
    pub pc: u32,
    /// How the CFA is found.
    pub cfa: u8,
    /// How the caller's frame pointer is found.
    pub rbp: u8,
    /// Offset added to the CFA's register.
    pub cfa_offset: i32,
    /// Offset of the saved frame pointer from the CFA.
    pub rbp_offset: i32,
}

impl CachedRow {
    fn to_bytes(self) -> [u8; ROW_BYTES] {
        let mut b = [0u8; ROW_BYTES];
        b[0..4].copy_from_slice(&self.pc.to_le_bytes());
        b[4] = self.cfa;
        b[5] = self.rbp;
        b[8..12].copy_from_slice(&self.cfa_offset.to_le_bytes());
        b[12..16].copy_from_slice(&self.rbp_offset.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8; ROW_BYTES]) -> Self {
        let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        CachedRow {
            pc: u32::from_le_bytes(word(0)),
            cfa: b[4],
            rbp: b[5],
            cfa_offset: i32::from_le_bytes(word(8)),
            rbp_offset: i32::from_le_bytes(word(12)),
        }
    }
}

/// The cache's directory, or none.
#[derive(Debug, Clone, Default)]
pub struct RowCache {
    dir: Option<PathBuf>,
}

impl RowCache {
    /// The cache in `dir` (`None`: no cache).
    pub fn at(dir: Option<PathBuf>) -> Self {
        RowCache {
            dir: dir.map(|d| d.join("cfi-v1")),
        }
    }

    /// The cache the environment names (see the module's documentation).
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let dir = match std::env::var_os("WHYSLOW_CACHE_DIR") {
            Some(d) if d.is_empty() => None,
            Some(d) => Some(PathBuf::from(d)),
            None => var("XDG_CACHE_HOME")
                .map(|d| PathBuf::from(d).join("whyslow"))
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache/whyslow"))),
        };
        RowCache::at(dir)
    }

    fn path(&self, build_id: &str) -> Option<PathBuf> {
        let ok = !build_id.is_empty()
            && build_id.len() <= 128
            && build_id.bytes().all(|b| b.is_ascii_hexdigit());
        Some(self.dir.as_ref()?.join(format!("{build_id}.rows"))).filter(|_| ok)
    }

    /// How many rows the module's file holds, when it has a whole one.
    pub fn count(&self, build_id: &str) -> Option<u32> {
        let path = self.path(build_id)?;
        let mut f = File::open(&path).ok()?;
        let count = header(&mut f)?;
        let len = f.metadata().ok()?.len();
        (len == 16 + u64::from(count) * ROW_BYTES as u64).then_some(count)
    }

    /// Hands each cached row of the module to `emit` until it returns
    /// false; the number of rows handed, or `None` when there is no whole
    /// file (or it could not be read to its end: some rows may have been
    /// handed then).
    pub fn for_each(&self, build_id: &str, mut emit: impl FnMut(CachedRow) -> bool) -> Option<u32> {
        let count = self.count(build_id)?;
        let mut r = BufReader::with_capacity(1 << 16, File::open(self.path(build_id)?).ok()?);
        header(&mut r)?;
        let mut b = [0u8; ROW_BYTES];
        let mut n = 0u32;
        while n < count {
            r.read_exact(&mut b).ok()?;
            n += 1;
            if !emit(CachedRow::from_bytes(&b)) {
                break;
            }
        }
        Some(n)
    }

    /// A writer for the module's rows, or `None` without a cache (or a
    /// directory that cannot be made).
    pub fn writer(&self, build_id: &str) -> Option<RowWriter> {
        let path = self.path(build_id)?;
        let dir = path.parent()?.to_path_buf();
        std::fs::create_dir_all(&dir).ok()?;
        let mut tmp = tempfile::NamedTempFile::new_in(&dir).ok()?;
        tmp.write_all(&[0u8; 16]).ok()?;
        Some(RowWriter {
            out: BufWriter::with_capacity(1 << 16, tmp),
            path,
            rows: 0,
            failed: false,
        })
    }
}

/// The row count a file's header declares, when it is one of ours.
fn header(r: &mut impl Read) -> Option<u32> {
    let mut h = [0u8; 16];
    r.read_exact(&mut h).ok()?;
    if h[..8] != MAGIC {
        return None;
    }
    let count = u64::from_le_bytes(h[8..16].try_into().ok()?);
    u32::try_from(count).ok()
}

/// A module's rows on their way to the cache, kept only when finished.
pub struct RowWriter {
    out: BufWriter<tempfile::NamedTempFile>,
    path: PathBuf,
    rows: u64,
    failed: bool,
}

impl RowWriter {
    /// Appends one row.
    pub fn push(&mut self, row: CachedRow) {
        if !self.failed {
            self.failed = self.out.write_all(&row.to_bytes()).is_err();
            self.rows += 1;
        }
    }

    /// Writes the header, puts the file in place and trims the cache;
    /// false when anything failed (nothing is left behind then).
    pub fn finish(self) -> bool {
        if self.failed {
            return false;
        }
        let Ok(mut tmp) = self.out.into_inner() else {
            return false;
        };
        let mut h = [0u8; 16];
        h[..8].copy_from_slice(&MAGIC);
        h[8..].copy_from_slice(&self.rows.to_le_bytes());
        let written = tmp.seek(SeekFrom::Start(0)).is_ok() && tmp.write_all(&h).is_ok();
        if !written || tmp.persist(&self.path).is_err() {
            return false;
        }
        if let Some(dir) = self.path.parent() {
            trim(dir, CAP_BYTES);
        }
        true
    }
}

/// Removes the least recently written rows files of `dir` until they hold
/// at most `cap` bytes.
fn trim(dir: &Path, cap: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "rows"))
        .filter_map(|e| {
            let md = e.metadata().ok()?;
            Some((md.modified().ok()?, md.len(), e.path()))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort();
    for (_, len, path) in files {
        if total <= cap {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: u32) -> Vec<CachedRow> {
        (0..n)
            .map(|i| CachedRow {
                pc: i * 16,
                cfa: (i % 3) as u8,
                rbp: (i % 2) as u8,
                cfa_offset: 8 + i as i32,
                rbp_offset: -16 - i as i32,
            })
            .collect()
    }

    #[test]
    fn rows_come_back_as_written_and_only_whole() {
        let tmp = whyslow_testkit::temp_dir("rowcache");
        let cache = RowCache::at(Some(tmp.path().to_path_buf()));
        assert_eq!(cache.count("abcd"), None);
        let want = rows(1000);
        let mut w = cache.writer("abcd").unwrap();
        for r in &want {
            w.push(*r);
        }
        assert!(w.finish());
        assert_eq!(cache.count("abcd"), Some(1000));
        let mut got = Vec::new();
        assert_eq!(
            cache.for_each("abcd", |r| {
                got.push(r);
                true
            }),
            Some(1000)
        );
        assert_eq!(got, want);
        // A writer dropped before `finish` leaves nothing.
        let mut w = cache.writer("ef01").unwrap();
        w.push(want[0]);
        drop(w);
        assert_eq!(cache.count("ef01"), None);
        // A cut file is not used.
        let path = tmp.path().join("cfi-v1/abcd.rows");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        assert_eq!(cache.count("abcd"), None);
        assert_eq!(cache.for_each("abcd", |_| true), None);
        // Names that are not a Build-ID never reach the file system.
        assert!(cache.writer("../x").is_none());
        assert!(RowCache::at(None).writer("abcd").is_none());
    }

    #[test]
    fn the_oldest_files_go_past_the_cap() {
        let tmp = whyslow_testkit::temp_dir("rowcache-cap");
        let cache = RowCache::at(Some(tmp.path().to_path_buf()));
        for id in ["aa", "bb", "cc"] {
            let mut w = cache.writer(id).unwrap();
            for r in rows(100) {
                w.push(r);
            }
            assert!(w.finish());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let each = 16 + 100 * ROW_BYTES as u64;
        trim(&tmp.path().join("cfi-v1"), 2 * each);
        assert_eq!(cache.count("aa"), None);
        assert_eq!(cache.count("bb"), Some(100));
        assert_eq!(cache.count("cc"), Some(100));
    }
}

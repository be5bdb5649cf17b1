//! A process's memory mappings (`/proc/PID/maps`): which file, at which file
//! offset, backs an address.

use std::path::PathBuf;

use crate::StackError;

/// One mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Executable (`x` in the permissions).
    pub exec: bool,
    /// File offset of `start`.
    pub offset: u64,
    /// The backing file's path as the process sees it (`[vdso]`, `[heap]`, …
    /// for special mappings; empty for anonymous ones).
    pub path: String,
}

impl Mapping {
    /// A file-backed mapping (not anonymous, not `[special]`).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/')
    }

    /// Whether `addr` lies in this mapping.
    pub fn contains(&self, addr: u64) -> bool {
        (self.start..self.end).contains(&addr)
    }

    /// The file offset of `addr` (which must lie in the mapping).
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }
}

/// Parses the text of `/proc/PID/maps`; lines that do not parse are skipped.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(_dev), Some(_inode)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        let path = it.collect::<Vec<_>>().join(" ");
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset)) = (
            u64::from_str_radix(a, 16),
            u64::from_str_radix(b, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        out.push(Mapping {
            start,
            end,
            exec: perms.as_bytes().get(2) == Some(&b'x'),
            offset,
            path,
        });
    }
    out.sort_by_key(|m| m.start);
    out
}

/// The mappings of process `pid`.
pub fn read_maps(pid: i32) -> Result<Vec<Mapping>, StackError> {
    let path = format!("/proc/{pid}/maps");
    let text = std::fs::read_to_string(&path).map_err(|e| StackError::Io(path, e))?;
    Ok(parse_maps(&text))
}

/// The path under which this process can open a file of `pid` (through the
/// target's root, so files in another mount namespace resolve too).
pub fn file_path(pid: i32, path: &str) -> PathBuf {
    let via_root = PathBuf::from(format!("/proc/{pid}/root{path}"));
    if via_root.exists() {
        via_root
    } else {
        PathBuf::from(path)
    }
}

/// The mapping holding `addr`, in `maps` sorted by start.
pub fn find(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    let i = maps.partition_point(|m| m.start <= addr);
    maps[..i].last().filter(|m| m.contains(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse_and_odd_ones_are_skipped() {
        let text = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234 /usr/bin/python3.11
55d0c0a21000-55d0c0c00000 r-xp 00021000 08:01 1234 /usr/bin/python3.11
7ffd1e5f0000-7ffd1e611000 rw-p 00000000 00:00 0 [stack]
7f00aa000000-7f00aa001000 r-xp 00000000 00:00 0
garbage line
7f00bb000000-7f00bb001000 r-xp 00001000 08:01 99 /opt/a dir/lib x.so
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 5);
        let py = find(&m, 0x55d0c0a21010).unwrap();
        assert!(py.exec && py.is_file());
        assert_eq!(py.file_offset(0x55d0c0a21010), 0x21010);
        assert_eq!(m[3].path, "/opt/a dir/lib x.so");
        assert!(find(&m, 0x1000).is_none());
        assert!(!m.iter().find(|x| x.path == "[stack]").unwrap().is_file());
    }
}

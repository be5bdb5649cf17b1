//! Separate debug files (`objcopy --only-keep-debug`, Debian's `-dbgsym`):
//! a stripped module is named from the debug file found by its Build-ID,
//! as perf and gdb do, and a debug file alone is indexed for the symbol
//! store only with the load segments of its program (SysOM-AI §3.4).

use std::path::{Path, PathBuf};
use std::process::Command;

use whyslow_stacks::elf::{build_id_of, ElfModule};
use whyslow_stacks::symindex::{build_index, layout_of, SymbolIndex};

const SOURCE: &str = "static volatile unsigned long sink;\n\
__attribute__((noinline)) static void whyslow_hidden_spin(void) {\n\
  for (unsigned long i = 0; i < 1000UL; i++) sink += i * i;\n}\n\
int main(void) { whyslow_hidden_spin(); return 0; }\n";

fn run(cmd: &str, args: &[&Path]) {
    let st = Command::new(cmd)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{cmd} runs (apt-get install gcc binutils): {e}"));
    assert!(st.success(), "{cmd} {args:?} failed");
}

/// Builds the program in `dir`: (full, stripped, debug directory, debug
/// file, Build-ID).
fn build(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf, String) {
    std::fs::create_dir_all(dir).unwrap();
    let src = dir.join("hidden.c");
    std::fs::write(&src, SOURCE).unwrap();
    let (full, exe) = (dir.join("hidden.full"), dir.join("hidden"));
    run(
        "gcc",
        &[
            Path::new("-O2"),
            Path::new("-g"),
            Path::new("-Wl,--build-id"),
            Path::new("-o"),
            &full,
            &src,
        ],
    );
    let id = build_id_of(&full).unwrap().expect("gcc wrote a Build-ID");
    let debug_dir = dir.join("debug");
    let debug = debug_dir
        .join(".build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]));
    std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
    run("objcopy", &[Path::new("--only-keep-debug"), &full, &debug]);
    run(
        "strip",
        &[Path::new("--strip-all"), Path::new("-o"), &exe, &full],
    );
    (full, exe, debug_dir, debug, id)
}

/// The file offset of `name`'s first instruction in `full`.
fn offset_of(full: &Path, name: &str) -> (u64, u64) {
    let m = ElfModule::open(full).unwrap();
    let s = m
        .symbols
        .iter()
        .find(|s| m.symbol_name(s).is_some_and(|n| n.starts_with(name)))
        .unwrap_or_else(|| panic!("{name} in {full:?}"));
    let seg = m
        .segments
        .iter()
        .find(|g| (g.vaddr..g.vaddr + g.filesz).contains(&s.address))
        .unwrap();
    (s.address, seg.offset + (s.address - seg.vaddr) + 1)
}

#[test]
fn a_stripped_module_is_named_from_its_debug_file_found_by_build_id() {
    let dir = std::env::temp_dir().join(format!("whyslow-debugfile-{}", std::process::id()));
    let (full, exe, debug_dir, debug, id) = build(&dir);
    let (svma, _) = offset_of(&full, "whyslow_hidden_spin");
    let mut m = ElfModule::open(&exe).unwrap();
    assert_eq!(m.build_id.as_deref(), Some(id.as_str()));
    let name = |m: &ElfModule| {
        m.symbol_at(svma + 1)
            .and_then(|s| m.symbol_name(s))
            .map(str::to_string)
    };
    assert_eq!(
        name(&m),
        None,
        "the stripped program names its static function"
    );
    assert_eq!(m.debug_file(&debug_dir), Some(debug.clone()));
    assert_eq!(m.debug_file(&dir.join("nowhere")), None);
    // Another program's debug file is not used.
    assert!(!m.use_symbols_of(ElfModule::open(&std::env::current_exe().unwrap()).unwrap()));
    assert!(m.use_symbols_of(ElfModule::open(&debug).unwrap()));
    assert!(
        name(&m).is_some_and(|n| n.starts_with("whyslow_hidden_spin")),
        "{:?}",
        name(&m)
    );
    // Unwinding still reads the module's own code.
    assert!(m.code_in_file);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_debug_file_is_indexed_with_its_programs_segments_only() {
    let dir = std::env::temp_dir().join(format!("whyslow-debugindex-{}", std::process::id()));
    let (full, exe, _, debug, _) = build(&dir);
    let (_, offset) = offset_of(&full, "whyslow_hidden_spin");
    assert!(!ElfModule::open(&debug).unwrap().code_in_file);
    let e = build_index(&debug, None).unwrap_err().to_string();
    assert!(e.contains("debug file"), "{e}");
    let (bytes, summary) = build_index(&debug, Some(&layout_of(&exe).unwrap())).unwrap();
    assert!(summary.symbols > 0);
    let idx = SymbolIndex::parse(&bytes).unwrap();
    assert!(
        idx.name_at_offset(offset)
            .is_some_and(|n| n.starts_with("whyslow_hidden_spin")),
        "{:?}",
        idx.name_at_offset(offset)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

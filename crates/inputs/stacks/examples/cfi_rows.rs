//! How many unwind rows (whyslow_stacks::cfi) each ELF file compiles to, and
//! how long that takes: `cargo run --release -p whyslow-stacks --example cfi_rows -- FILE…`.

fn main() {
    for path in std::env::args().skip(1) {
        let t = std::time::Instant::now();
        let m = match whyslow_stacks::elf::ElfModule::open(std::path::Path::new(&path)) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("{path}: {e}");
                continue;
            }
        };
        let Some((range, bytes)) = &m.unwind.eh_frame else {
            println!("{path}: no .eh_frame");
            continue;
        };
        let text = m.unwind.text.as_ref().map(|(r, _)| r.start).unwrap_or(0);
        let (rows, summary) = whyslow_stacks::cfi::compile_eh_frame(bytes, range.start, text);
        println!(
            "{path}: .eh_frame {} KiB, {} FDEs, {} rows ({} unsupported), {:.2} s",
            bytes.len() / 1024,
            summary.fdes,
            rows.len(),
            summary.unsupported,
            t.elapsed().as_secs_f64()
        );
    }
}

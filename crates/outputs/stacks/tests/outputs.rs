//! The stack outputs on small hand-built profiles: exact folded text, round
//! trips through folded and pprof, SVG well-formedness and geometry,
//! differential colours, speedscope totals, and garbage fed to the parsers.

use std::collections::BTreeMap;

use whyslow_model::rng::SplitMix64;
use whyslow_model::stack::{Frame, FrameKind, StackCount, StackProfile, StackProfileBuilder};
use whyslow_stack_output::{
    from_pprof, parse_folded, to_diff_flamegraph_svg, to_flamegraph_svg, to_folded, to_pprof,
    to_speedscope_json, FlameOptions, FoldedError, PprofError,
};

// ---------------------------------------------------------------- profiles

fn native(name: Option<&str>, module: &str, build_id: &str, offset: u64) -> Frame {
    Frame {
        kind: FrameKind::Native,
        name: name.map(str::to_string),
        module: Some(module.to_string()),
        build_id: Some(build_id.to_string()),
        offset,
        line: None,
    }
}

fn python(name: &str, file: &str, line: u32) -> Frame {
    Frame {
        kind: FrameKind::Python,
        name: Some(name.to_string()),
        module: Some(file.to_string()),
        build_id: None,
        offset: 0,
        line: Some(line),
    }
}

fn kernel(name: Option<&str>, offset: u64) -> Frame {
    Frame {
        kind: FrameKind::Kernel,
        name: name.map(str::to_string),
        module: Some("[kernel]".to_string()),
        build_id: None,
        offset,
        line: None,
    }
}

/// 100 samples at 99 Hz: a thread label root, Python frames, native frames
/// (one symbolized, one not), kernel frames (one symbolized, one not).
/// `at::matmul` has exactly half of the samples.
fn sample_profile() -> StackProfile {
    let mut b = StackProfileBuilder::new();
    let t = b.frame(Frame::label("python3"));
    let main = b.frame(python("main", "train.py", 10));
    let fwd = b.frame(python("forward", "model.py", 42));
    let load = b.frame(python("load", "data.py", 7));
    let mm = b.frame(native(
        Some("at::matmul"),
        "/usr/lib/libtorch.so",
        "abcd",
        0x1000,
    ));
    let read = b.frame(native(None, "/usr/lib/libc.so.6", "ef01", 0x2a0));
    let sys = b.frame(kernel(Some("do_syscall_64"), 0xffff_ffff_8100_0000));
    let kun = b.frame(kernel(None, 0xffff_ffff_8100_1234));
    b.add(vec![t, main, fwd, mm], 40);
    b.add(vec![t, main, fwd, mm, read, sys], 10);
    b.add(vec![t, main, fwd], 10);
    b.add(vec![t, main, load, read, sys, kun], 30);
    b.add(vec![t, main, load], 10);
    b.label("host", "node1");
    b.label("pid", "42");
    b.finish(99.0, 1_700_000_000_000_000_000, 10_000_000_000)
}

/// Stacks as root-first display strings → counts.
fn displayed(p: &StackProfile) -> BTreeMap<Vec<String>, u64> {
    let mut out = BTreeMap::new();
    for s in &p.stacks {
        let path = s
            .frames
            .iter()
            .map(|&i| p.frames[i as usize].display())
            .collect();
        *out.entry(path).or_insert(0) += s.count;
    }
    out
}

// ---------------------------------------------------------------- folded

const SAMPLE_FOLDED: &str = "\
python3;main (train.py:10);forward (model.py:42) 10
python3;main (train.py:10);forward (model.py:42);at::matmul 40
python3;main (train.py:10);forward (model.py:42);at::matmul;libc.so.6+0x2a0;do_syscall_64_[k] 10
python3;main (train.py:10);load (data.py:7) 10
python3;main (train.py:10);load (data.py:7);libc.so.6+0x2a0;do_syscall_64_[k];[kernel]+0xffffffff81001234_[k] 30
";

#[test]
fn folded_text_is_exact_sorted_and_root_first() {
    assert_eq!(to_folded(&sample_profile()), SAMPLE_FOLDED);
}

#[test]
fn folded_sanitizes_separators_and_sums_stacks_that_render_alike() {
    let mut b = StackProfileBuilder::new();
    let a = b.frame(Frame::label("a;b"));
    let a2 = b.frame(Frame::label("a:b"));
    let nl = b.frame(Frame::label("x\ny"));
    let empty = b.frame(Frame::label(""));
    b.add(vec![a, nl], 1);
    b.add(vec![a2, nl], 2);
    b.add(vec![empty], 3);
    b.add(vec![a], 0); // no samples: left out
    b.add(vec![], 4); // no frames: left out
    let p = b.finish(0.0, 0, 0);
    assert_eq!(to_folded(&p), "[unknown] 3\na:b;x y 3\n");
}

#[test]
fn folded_round_trips_text_and_frame_kinds() {
    let text = to_folded(&sample_profile());
    let parsed = parse_folded(&text).unwrap();
    assert_eq!(to_folded(&parsed), text);
    assert_eq!(parsed.total(), 100);
    assert_eq!(displayed(&parsed), displayed(&sample_profile()));
    let find = |d: &str| parsed.frames.iter().find(|f| f.display() == d).unwrap();
    let fwd = find("forward (model.py:42)");
    assert_eq!(fwd.kind, FrameKind::Python);
    assert_eq!(fwd.name.as_deref(), Some("forward"));
    assert_eq!(
        (fwd.module.as_deref(), fwd.line),
        (Some("model.py"), Some(42))
    );
    let sys = find("do_syscall_64");
    assert_eq!(sys.kind, FrameKind::Kernel);
    let kun = find("[kernel]+0xffffffff81001234");
    assert_eq!(
        (kun.kind, &kun.name, kun.offset),
        (FrameKind::Kernel, &None, 0xffff_ffff_8100_1234)
    );
    let read = find("libc.so.6+0x2a0");
    assert_eq!(read.kind, FrameKind::Native);
    assert_eq!(
        (read.name.as_deref(), read.module.as_deref(), read.offset),
        (None, Some("libc.so.6"), 0x2a0)
    );
    let mm = find("at::matmul");
    assert_eq!(
        (mm.kind, mm.name.as_deref()),
        (FrameKind::Native, Some("at::matmul"))
    );
}

#[test]
fn folded_reads_gregg_style_input() {
    let text = "# comment\n\nmain;foo;bar 3\r\nmain;foo;bar 2\nmain;foo\t7\n  \n";
    let p = parse_folded(text).unwrap();
    assert_eq!(p.total(), 12);
    assert_eq!(to_folded(&p), "main;foo 7\nmain;foo;bar 5\n");
    assert_eq!(p.frames[0].kind, FrameKind::Native);
    assert_eq!(p.hz, 0.0);
}

#[test]
fn folded_errors_name_the_line_and_what_was_expected() {
    let cases: [(&str, FoldedError); 6] = [
        ("a 1\nabc\n", FoldedError::MissingCount { line: 2 }),
        (
            "a 1\n\n# x\na;b x12\n",
            FoldedError::BadCount {
                line: 4,
                found: "x12".into(),
            },
        ),
        (
            "a -3\n",
            FoldedError::BadCount {
                line: 1,
                found: "-3".into(),
            },
        ),
        (" 5\n", FoldedError::EmptyStack { line: 1 }),
        ("a;;b 5\n", FoldedError::EmptyFrame { line: 1, frame: 2 }),
        (
            "a 18446744073709551615\na 1\n",
            FoldedError::CountOverflow { line: 2 },
        ),
    ];
    for (text, want) in cases {
        let err = parse_folded(text).unwrap_err();
        assert_eq!(err, want, "{text:?}");
        let msg = err.to_string();
        assert!(msg.starts_with("line "), "{msg}");
        assert!(msg.contains("expected"), "{msg}");
    }
}

// ---------------------------------------------------------------- pprof

#[test]
fn pprof_round_trips_samples_stacks_and_metadata() {
    let p = sample_profile();
    let bytes = to_pprof(&p);
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip-compressed");
    let back = from_pprof(&bytes).unwrap();
    assert_eq!(back.total(), p.total());
    assert_eq!(displayed(&back), displayed(&p));
    assert!((back.hz - 99.0).abs() < 1e-3, "{}", back.hz);
    assert_eq!(back.start_unix_ns, p.start_unix_ns);
    assert_eq!(back.duration_ns, p.duration_ns);
    assert_eq!(back.labels, p.labels);
    // Kinds, modules, Build-IDs and offsets come back too.
    let find = |d: &str| back.frames.iter().find(|f| f.display() == d).unwrap();
    assert_eq!(find("python3").kind, FrameKind::Label);
    let fwd = find("forward (model.py:42)");
    assert_eq!((fwd.kind, fwd.line), (FrameKind::Python, Some(42)));
    let read = find("libc.so.6+0x2a0");
    assert_eq!(read.kind, FrameKind::Native);
    assert_eq!(read.name, None);
    assert_eq!(read.module.as_deref(), Some("/usr/lib/libc.so.6"));
    assert_eq!(read.build_id.as_deref(), Some("ef01"));
    assert_eq!(read.offset, 0x2a0);
    let mm = find("at::matmul");
    assert_eq!((mm.build_id.as_deref(), mm.offset), (Some("abcd"), 0x1000));
    assert_eq!(find("do_syscall_64").kind, FrameKind::Kernel);
    assert_eq!(find("[kernel]+0xffffffff81001234").kind, FrameKind::Kernel);
    // Deterministic.
    assert_eq!(to_pprof(&p), bytes);
}

#[test]
fn pprof_reads_raw_protobuf_and_profiles_without_a_rate() {
    use std::io::Read;
    let mut p = sample_profile();
    p.hz = 0.0;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&to_pprof(&p)[..])
        .read_to_end(&mut raw)
        .unwrap();
    let back = from_pprof(&raw).unwrap();
    assert_eq!(back.total(), 100);
    assert_eq!(back.hz, 0.0);
    assert_eq!(displayed(&back), displayed(&p));
}

#[test]
fn pprof_keeps_several_label_frames_in_order() {
    let mut b = StackProfileBuilder::new();
    let proc_ = b.frame(Frame::label("pid 7"));
    let thread = b.frame(Frame::label("worker-1"));
    let f = b.frame(native(Some("f"), "/bin/x", "01", 16));
    b.add(vec![proc_, thread, f], 3);
    let p = b.finish(100.0, 0, 0);
    let back = from_pprof(&to_pprof(&p)).unwrap();
    assert_eq!(displayed(&back), displayed(&p));
}

#[test]
fn pprof_errors_are_errors() {
    assert!(matches!(
        from_pprof(&[0x1f, 0x8b, 1, 2, 3]),
        Err(PprofError::Gzip(_))
    ));
    assert!(matches!(
        from_pprof(&[0xff; 16]),
        Err(PprofError::Decode(_))
    ));
    // An empty message is a valid, empty profile.
    assert_eq!(from_pprof(&[]).unwrap().total(), 0);
}

// ---------------------------------------------------------------- SVG

/// Checks that `s` is well-formed XML (one root, balanced and matching
/// tags, quoted attributes without `<`, known entities only).
fn check_xml(s: &str) -> Result<(), String> {
    fn entities(t: &str, at: usize) -> Result<(), String> {
        let mut rest = t;
        while let Some(i) = rest.find('&') {
            let after = &rest[i + 1..];
            let end = after
                .find(';')
                .ok_or(format!("unterminated entity near {at}"))?;
            let name = &after[..end];
            let ok = matches!(name, "amp" | "lt" | "gt" | "quot" | "apos")
                || name
                    .strip_prefix("#x")
                    .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
                || name
                    .strip_prefix('#')
                    .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
            if !ok {
                return Err(format!("bad entity &{name}; near {at}"));
            }
            rest = &after[end + 1..];
        }
        Ok(())
    }
    fn name_end(s: &str) -> usize {
        s.find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | ':' | '-' | '.')))
            .unwrap_or(s.len())
    }
    let mut stack: Vec<&str> = Vec::new();
    let mut roots = 0;
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        if let Some(r) = rest.strip_prefix("<?") {
            i += 2 + r.find("?>").ok_or("unterminated <?")? + 2;
        } else if let Some(r) = rest.strip_prefix("<!--") {
            i += 4 + r.find("-->").ok_or("unterminated comment")? + 3;
        } else if let Some(r) = rest.strip_prefix("<![CDATA[") {
            if stack.is_empty() {
                return Err("CDATA outside the root".into());
            }
            i += 9 + r.find("]]>").ok_or("unterminated CDATA")? + 3;
        } else if let Some(r) = rest.strip_prefix("</") {
            let end = r.find('>').ok_or("unterminated end tag")?;
            let name = r[..end].trim_end();
            match stack.pop() {
                Some(open) if open == name => {}
                other => return Err(format!("</{name}> closes {other:?} at {i}")),
            }
            i += 2 + end + 1;
        } else if let Some(r) = rest.strip_prefix('<') {
            let n = name_end(r);
            if n == 0 {
                return Err(format!("bad tag at {i}"));
            }
            let name = &r[..n];
            if stack.is_empty() {
                roots += 1;
            }
            let mut j = n;
            let mut seen: Vec<&str> = Vec::new();
            loop {
                let t = &r[j..];
                let ws = t.len() - t.trim_start().len();
                j += ws;
                let t = &r[j..];
                if t.starts_with("/>") {
                    j += 2;
                    break;
                }
                if t.starts_with('>') {
                    stack.push(name);
                    j += 1;
                    break;
                }
                if ws == 0 {
                    return Err(format!(
                        "expected space before attribute in <{name}> at {i}"
                    ));
                }
                let an = name_end(t);
                if an == 0 {
                    return Err(format!(
                        "bad attribute in <{name}> at {i}: {:?}",
                        &t[..t.len().min(20)]
                    ));
                }
                if seen.contains(&&t[..an]) {
                    return Err(format!("duplicate attribute {} at {i}", &t[..an]));
                }
                seen.push(&t[..an]);
                let t2 = &t[an..];
                let q = t2.strip_prefix('=').ok_or(format!("expected = at {i}"))?;
                let quote = q.chars().next().ok_or("eof")?;
                if quote != '"' && quote != '\'' {
                    return Err(format!("unquoted attribute at {i}"));
                }
                let vend = q[1..].find(quote).ok_or("unterminated attribute")?;
                let value = &q[1..1 + vend];
                if value.contains('<') {
                    return Err(format!("< in attribute at {i}"));
                }
                entities(value, i)?;
                j += an + 1 + 1 + vend + 1;
            }
            i += 1 + j;
        } else {
            let end = rest.find('<').unwrap_or(rest.len());
            let text = &rest[..end];
            if stack.is_empty() && !text.trim().is_empty() {
                return Err(format!("text outside the root at {i}"));
            }
            entities(text, i)?;
            if text
                .chars()
                .any(|c| (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r'))
            {
                return Err(format!("control character at {i}"));
            }
            i += end;
        }
    }
    if !stack.is_empty() {
        return Err(format!("unclosed {stack:?}"));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(())
}

/// The `<g>…</g>` of the frame whose tooltip starts with `name (`.
fn frame_g<'a>(svg: &'a str, name: &str) -> &'a str {
    let at = svg
        .find(&format!("<title>{name} ("))
        .unwrap_or_else(|| panic!("no frame {name}"));
    let start = svg[..at].rfind("<g").unwrap();
    let end = at + svg[at..].find("</g>").unwrap();
    &svg[start..end]
}

/// The value of `attr` on the `<rect` inside `g`.
fn rect_attr<'a>(g: &'a str, attr: &str) -> &'a str {
    let rect = &g[g.find("<rect").unwrap()..];
    let key = format!(" {attr}=\"");
    let v = &rect[rect.find(&key).unwrap() + key.len()..];
    &v[..v.find('"').unwrap()]
}

fn rect_num(g: &str, attr: &str) -> f64 {
    rect_attr(g, attr).parse().unwrap()
}

fn fill(g: &str) -> (u8, u8, u8) {
    let f = rect_attr(g, "fill");
    let inner = f.strip_prefix("rgb(").unwrap().strip_suffix(')').unwrap();
    let v: Vec<u8> = inner.split(',').map(|x| x.parse().unwrap()).collect();
    (v[0], v[1], v[2])
}

#[test]
fn xml_checker_rejects_broken_documents() {
    assert!(check_xml("<a><b/></a>").is_ok());
    assert!(check_xml("<a><b></a>").is_err());
    assert!(check_xml("<a x=\"<\"/>").is_err());
    assert!(check_xml("<a>&nope;</a>").is_err());
    assert!(check_xml("<a/><b/>").is_err());
    assert!(check_xml("<a>x & y</a>").is_err());
}

#[test]
fn flame_graph_is_well_formed_names_every_frame_and_scales_widths() {
    let p = sample_profile();
    let svg = to_flamegraph_svg(&p, &FlameOptions::default());
    check_xml(&svg).unwrap();
    assert!(svg.starts_with("<?xml"));
    for f in &p.frames {
        frame_g(&svg, &f.display());
    }
    let root = frame_g(&svg, "all");
    assert!(root.contains("<title>all (100 samples, 100.00%)</title>"));
    assert!((rect_num(root, "width") - 1180.0).abs() < 0.01);
    let mm = frame_g(&svg, "at::matmul");
    assert!(mm.contains("(50 samples, 50.00%)"));
    assert!((rect_num(mm, "width") * 2.0 - rect_num(root, "width")).abs() < 1.0);
    let fwd = frame_g(&svg, "forward (model.py:42)");
    assert!((rect_num(fwd, "width") - 0.6 * 1180.0).abs() < 1.0);
    // Classic: the root at the bottom, callees above.
    assert!(rect_num(root, "y") > rect_num(mm, "y"));
    // Children of one parent sit side by side within it.
    let load = frame_g(&svg, "load (data.py:7)");
    let main = frame_g(&svg, "main (train.py:10)");
    assert_eq!(rect_num(fwd, "y"), rect_num(load, "y"));
    assert!(rect_num(load, "x") >= rect_num(main, "x"));
    assert!(
        rect_num(load, "x") + rect_num(load, "width")
            <= rect_num(main, "x") + rect_num(main, "width") + 0.01
    );
    // Colours by kind: kernel blue, native warm, Python green/yellow.
    let k = fill(frame_g(&svg, "do_syscall_64"));
    assert!(k.2 > k.0 && k.2 > 200, "{k:?}");
    let n = fill(mm);
    assert!(n.0 >= 205 && n.2 <= 55, "{n:?}");
    let py = fill(fwd);
    assert!(py.1 >= 190 && py.2 <= 80, "{py:?}");
    // Deterministic.
    assert_eq!(to_flamegraph_svg(&p, &FlameOptions::default()), svg);
}

#[test]
fn flame_graph_options_icicle_width_and_min_width() {
    let mut b = StackProfileBuilder::new();
    let t = b.frame(Frame::label("t"));
    let big = b.frame(Frame::label("big"));
    let tiny = b.frame(Frame::label("tiny"));
    b.add(vec![t, big], 999_999);
    b.add(vec![t, tiny], 1);
    let p = b.finish(0.0, 0, 0);
    let o = FlameOptions {
        title: "T <&> \"q\"".into(),
        width: 600,
        frame_height: 20,
        icicle: true,
        ..FlameOptions::default()
    };
    let svg = to_flamegraph_svg(&p, &o);
    check_xml(&svg).unwrap();
    assert!(svg.contains("T &lt;&amp;&gt; &quot;q&quot;"));
    assert!(svg.contains("width=\"600\""));
    let root = frame_g(&svg, "all");
    let big_g = frame_g(&svg, "big");
    assert!((rect_num(root, "width") - 580.0).abs() < 0.01);
    assert!(
        rect_num(root, "y") < rect_num(big_g, "y"),
        "icicle: root on top"
    );
    assert_eq!(rect_num(big_g, "height"), 19.0);
    // 1 of 10^6 samples on 580 px is 0.00058 px, below the default 0.1 px.
    assert!(!svg.contains("<title>tiny"));
    let all = FlameOptions {
        min_width_px: 0.0,
        ..o
    };
    assert!(to_flamegraph_svg(&p, &all).contains("<title>tiny (1 sample, "));
}

#[test]
fn flame_graph_escapes_names_and_cuts_labels_to_fit() {
    let mut b = StackProfileBuilder::new();
    let odd = b.frame(Frame::label("a<b>&\"c\" 'd'\u{1}"));
    let long = b.frame(Frame::label("x".repeat(500)));
    let short = b.frame(Frame::label("s"));
    b.add(vec![odd, long], 5);
    b.add(vec![short], 5);
    let svg = to_flamegraph_svg(&b.finish(0.0, 0, 0), &FlameOptions::default());
    check_xml(&svg).unwrap();
    assert!(svg.contains("a&lt;b&gt;&amp;&quot;c&quot; &apos;d&apos;?"));
    let g = frame_g(&svg, &"x".repeat(500));
    let text = &g[g.find("<text").unwrap()..];
    let label = &text[text.find('>').unwrap() + 1..text.find("</text>").unwrap()];
    assert!(label.ends_with(".."), "{label}");
    assert!((label.chars().count() as f64) * 0.59 * 12.0 <= rect_num(g, "width"));
}

#[test]
fn an_empty_profile_draws_a_message() {
    let svg = to_flamegraph_svg(&StackProfile::default(), &FlameOptions::default());
    check_xml(&svg).unwrap();
    assert!(svg.contains("No samples"));
    let diff = to_diff_flamegraph_svg(
        &StackProfile::default(),
        &StackProfile::default(),
        &FlameOptions::default(),
    );
    check_xml(&diff).unwrap();
}

// ---------------------------------------------------------------- diff

#[test]
fn diff_flame_graph_colours_growth_red_shrinkage_blue_and_lists_removed_paths() {
    let build = |stacks: &[(&[&str], u64)]| {
        let mut b = StackProfileBuilder::new();
        for (names, count) in stacks {
            let ids = names.iter().map(|n| b.frame(Frame::label(*n))).collect();
            b.add(ids, *count);
        }
        b.finish(99.0, 0, 0)
    };
    // base: 100 samples; new: 1000 samples (shares, not counts, compare).
    let base = build(&[
        (&["t", "compute"], 50),
        (&["t", "io"], 40),
        (&["t", "gc"], 10),
    ]);
    let new = build(&[
        (&["t", "compute"], 800),
        (&["t", "io"], 200),
        // `gc` is gone; `t` keeps 100%.
    ]);
    let svg = to_diff_flamegraph_svg(&base, &new, &FlameOptions::default());
    check_xml(&svg).unwrap();
    let compute = frame_g(&svg, "compute");
    assert!(
        compute.contains("(800 samples, 50.00% → 80.00%, +30.00 pp)"),
        "{compute}"
    );
    let (r, g, b) = fill(compute);
    assert!(
        r == 255 && g < 100 && b < 100,
        "grown is red: {:?}",
        (r, g, b)
    );
    let io = frame_g(&svg, "io");
    assert!(io.contains("40.00% → 20.00%, -20.00 pp"));
    let (r, g, b) = fill(io);
    assert!(
        b == 255 && r < 200 && g < 200,
        "shrunk is blue: {:?}",
        (r, g, b)
    );
    // The largest change is full colour, a smaller one lighter.
    assert!(fill(io).0 > fill(compute).1);
    let t = frame_g(&svg, "t");
    assert_eq!(fill(t), (225, 225, 225), "unchanged is grey");
    // Widths from `new`.
    assert!((rect_num(compute, "width") - 0.8 * 1180.0).abs() < 1.0);
    // The removed path is listed, hatched and dashed, with its share.
    let removed = &svg[svg.find("<g id=\"removed\">").expect("a removed section")..];
    assert!(removed.contains("Only in base (removed): 1 path, 10.00% of base samples"));
    assert!(removed.contains("<title>t;gc (10.00% → 0.00%, -10.00 pp)</title>"));
    assert!(removed.contains("fill=\"url(#hatch)\""));
    assert!(removed.contains("stroke-dasharray"));
    assert!(!svg[..svg.find("<g id=\"removed\">").unwrap()].contains("<title>gc"));
    // Identical profiles: everything grey, nothing removed.
    let same = to_diff_flamegraph_svg(&new, &new, &FlameOptions::default());
    check_xml(&same).unwrap();
    assert_eq!(fill(frame_g(&same, "compute")), (225, 225, 225));
    assert!(!same.contains("id=\"removed\""));
}

#[test]
fn diff_flame_graph_caps_the_removed_list() {
    let mut b = StackProfileBuilder::new();
    let t = b.frame(Frame::label("t"));
    for i in 0..40 {
        let f = b.frame(Frame::label(format!("gone{i:02}")));
        b.add(vec![t, f], 1 + i);
    }
    let base = b.finish(0.0, 0, 0);
    let mut b = StackProfileBuilder::new();
    let t = b.frame(Frame::label("t"));
    b.add(vec![t], 1);
    let new = b.finish(0.0, 0, 0);
    let o = FlameOptions {
        max_removed: 5,
        ..FlameOptions::default()
    };
    let svg = to_diff_flamegraph_svg(&base, &new, &o);
    check_xml(&svg).unwrap();
    assert_eq!(svg.matches("class=\"removed\"").count(), 5);
    assert!(svg.contains("… and 35 more"));
    // Largest first.
    assert!(svg.find("t;gone39").unwrap() < svg.find("t;gone38").unwrap());
}

// ---------------------------------------------------------------- speedscope

#[test]
fn speedscope_json_parses_and_its_weights_sum_to_the_total() {
    let mut p = sample_profile();
    p.labels.insert("command".into(), "train.py".into());
    p.hz = 100.0;
    let v: serde_json::Value = serde_json::from_str(&to_speedscope_json(&p)).unwrap();
    assert_eq!(
        v["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    assert_eq!(v["exporter"], "whyslow");
    assert_eq!(v["activeProfileIndex"], 0);
    assert_eq!(v["name"], "train.py");
    let frames = v["shared"]["frames"].as_array().unwrap();
    let prof = &v["profiles"][0];
    assert_eq!(prof["type"], "sampled");
    assert_eq!(prof["unit"], "nanoseconds");
    assert_eq!(prof["startValue"], 0);
    let samples = prof["samples"].as_array().unwrap();
    let weights: Vec<u64> = prof["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_u64().unwrap())
        .collect();
    assert_eq!(samples.len(), weights.len());
    assert_eq!(weights.iter().sum::<u64>(), 100 * 10_000_000);
    assert_eq!(prof["endValue"].as_u64().unwrap(), 100 * 10_000_000);
    for s in samples {
        let s = s.as_array().unwrap();
        let first = s[0].as_u64().unwrap() as usize;
        assert_eq!(frames[first]["name"], "python3", "root first");
        assert!(s
            .iter()
            .all(|i| (i.as_u64().unwrap() as usize) < frames.len()));
    }
    let fwd = frames.iter().find(|f| f["name"] == "forward").unwrap();
    assert_eq!(
        (fwd["file"].as_str(), fwd["line"].as_u64()),
        (Some("model.py"), Some(42))
    );

    p.hz = 0.0;
    let v: serde_json::Value = serde_json::from_str(&to_speedscope_json(&p)).unwrap();
    let prof = &v["profiles"][0];
    assert_eq!(prof["unit"], "none");
    let sum: u64 = prof["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_u64().unwrap())
        .sum();
    assert_eq!(sum, 100);
    assert_eq!(prof["endValue"], 100);
}

// ---------------------------------------------------------------- garbage

#[test]
fn garbage_never_panics_the_parsers() {
    let mut rng = SplitMix64::new(0x5eed);
    let good_pprof = to_pprof(&sample_profile());
    let mut raw_pprof = Vec::new();
    {
        use std::io::Read;
        flate2::read::GzDecoder::new(&good_pprof[..])
            .read_to_end(&mut raw_pprof)
            .unwrap();
    }
    let pieces = [
        "a",
        ";",
        " ",
        "\t",
        "\n",
        "#",
        "12",
        "-1",
        "_[k]",
        "+0x",
        "ff",
        "(",
        ")",
        ":",
        ".py",
        "[kernel]",
        "18446744073709551615",
        "é",
        "\r",
        "",
    ];
    for round in 0..3000 {
        // Random bytes.
        let len = rng.below(200) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let _ = parse_folded(&String::from_utf8_lossy(&bytes));
        let _ = from_pprof(&bytes);
        // Text from folded-looking pieces.
        let text: String = (0..rng.below(60))
            .map(|_| pieces[rng.below(pieces.len() as u64) as usize])
            .collect();
        if let Ok(p) = parse_folded(&text) {
            // What parses renders, and renders back to the same text.
            let folded = to_folded(&p);
            assert_eq!(
                to_folded(&parse_folded(&folded).unwrap()),
                folded,
                "{text:?}"
            );
        }
        // A valid profile with some bytes changed, raw and gzipped.
        let mut m = raw_pprof.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(m.len() as u64) as usize;
            m[i] = rng.next_u64() as u8;
        }
        if round % 3 == 0 {
            m.truncate(rng.below(m.len() as u64) as usize);
        }
        if let Ok(p) = from_pprof(&m) {
            let _ = to_pprof(&p);
        }
        let mut g = good_pprof.clone();
        let i = rng.below(g.len() as u64) as usize;
        g[i] ^= 1 << rng.below(8);
        let _ = from_pprof(&g);
    }
}

#[test]
fn hostile_profiles_never_panic_the_renderers() {
    let mut rng = SplitMix64::new(7);
    let kinds = [
        FrameKind::Kernel,
        FrameKind::Native,
        FrameKind::Python,
        FrameKind::Label,
    ];
    for _ in 0..200 {
        let frames: Vec<Frame> = (0..rng.below(6))
            .map(|_| Frame {
                kind: kinds[rng.below(4) as usize],
                name: rng.chance(0.7).then(|| {
                    let pool = [
                        "f", ";", "<", "&", "\"", "\n", "é", "\u{0}", "(a.py:3)", " ",
                    ];
                    (0..rng.below(5))
                        .map(|_| pool[rng.below(10) as usize])
                        .collect()
                }),
                module: rng.chance(0.5).then(|| "/lib/x.so".to_string()),
                build_id: rng.chance(0.5).then(|| "ab".to_string()),
                offset: rng.next_u64(),
                line: rng.chance(0.3).then(|| rng.next_u64() as u32),
            })
            .collect();
        let stacks = (0..rng.below(6))
            .map(|_| StackCount {
                // Indices may be out of range.
                frames: (0..rng.below(5)).map(|_| rng.below(8) as u32).collect(),
                count: if rng.chance(0.3) {
                    u64::MAX
                } else {
                    rng.below(5)
                },
            })
            .collect();
        let p = StackProfile {
            frames,
            stacks,
            hz: [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-300, 99.0][rng.below(6) as usize],
            start_unix_ns: rng.next_u64(),
            duration_ns: rng.next_u64(),
            labels: [("k;\n<".to_string(), "v&".to_string())].into(),
        };
        let folded = to_folded(&p);
        let again = parse_folded(&folded).unwrap();
        assert_eq!(to_folded(&again), folded);
        let _ = from_pprof(&to_pprof(&p)).unwrap();
        check_xml(&to_flamegraph_svg(&p, &FlameOptions::default())).unwrap();
        check_xml(&to_diff_flamegraph_svg(
            &p,
            &again,
            &FlameOptions::default(),
        ))
        .unwrap();
        check_xml(&to_diff_flamegraph_svg(
            &again,
            &p,
            &FlameOptions::default(),
        ))
        .unwrap();
        let _: serde_json::Value = serde_json::from_str(&to_speedscope_json(&p)).unwrap();
    }
    // Silly options.
    let o = FlameOptions {
        width: 0,
        frame_height: 0,
        min_width_px: f64::NAN,
        ..FlameOptions::default()
    };
    check_xml(&to_flamegraph_svg(&sample_profile(), &o)).unwrap();
}

#[test]
fn deep_stacks_do_not_overflow_the_call_stack() {
    let mut b = StackProfileBuilder::new();
    let ids: Vec<u32> = (0..20_000)
        .map(|i| b.frame(Frame::label(format!("f{i}"))))
        .collect();
    b.add(ids, 3);
    let p = b.finish(99.0, 0, 0);
    let folded = to_folded(&p);
    assert_eq!(
        parse_folded(&folded).unwrap().stacks[0].frames.len(),
        20_000
    );
    assert_eq!(from_pprof(&to_pprof(&p)).unwrap().total(), 3);
    let svg = to_flamegraph_svg(&p, &FlameOptions::default());
    assert!(svg.contains("<title>f19999 (3 samples, 100.00%)</title>"));
    let _ = to_diff_flamegraph_svg(&p, &p, &FlameOptions::default());
    let _ = to_speedscope_json(&p);
}

//! `whyslow hang`'s outputs: the terminal report and a self-contained HTML
//! page with the waits-for graph (who waits for whom, culprits on top).

use std::collections::BTreeMap;
use std::fmt::Write;

use maud::{html, Markup, PreEscaped};
use whyslow_model::hang::{Culprit, HangReport, ThreadStack, Waiting};

fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn group_label(name: &str, desc: &str) -> String {
    if desc.is_empty() {
        format!("group {name}")
    } else {
        format!("{desc} (group {name})")
    }
}

fn stack_lines(st: &ThreadStack, max: usize) -> Vec<String> {
    let mut out: Vec<String> = st
        .frames
        .iter()
        .take(max)
        .map(|f| format!("    {}", clean(&f.label())))
        .collect();
    if st.frames.len() > max {
        out.push(format!("    … {} more frame(s)", st.frames.len() - max));
    }
    out
}

/// The report for a terminal.
pub fn hang_table(r: &HangReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}", clean(&r.verdict));
    if !r.culprits.is_empty() {
        let _ = writeln!(s, "\nCulprits (the ranks the others wait for):");
    }
    for c in &r.culprits {
        let group = if c.group.is_empty() {
            String::new()
        } else {
            format!(
                " in {} {:?}: {} seq {}{}",
                clean(&group_label(&c.group, &c.group_desc)),
                c.group_ranks,
                clean(&c.op),
                c.seq,
                if c.sizes.is_empty() {
                    String::new()
                } else {
                    format!(" {:?}", c.sizes)
                }
            )
        };
        let _ = writeln!(
            s,
            "  {} [{}]{}",
            who(c.rank, c.last_rank),
            c.reason.as_str(),
            group
        );
        let _ = writeln!(s, "    {}", clean(&c.detail));
        if !c.waited_by.is_empty() {
            let _ = writeln!(
                s,
                "    waited for by rank(s) {}",
                crate::compact_ranks(&c.waited_by, 120)
            );
        }
        if let Some(st) = &c.stack {
            let _ = writeln!(
                s,
                "    stack ({}, {} thread):",
                clean(&st.source),
                clean(&st.thread)
            );
            for l in stack_lines(st, 8) {
                let _ = writeln!(s, "  {l}");
            }
        }
    }
    if !r.waiting.is_empty() {
        let _ = writeln!(s, "\nWaiting:");
        for w in &r.waiting {
            let waited = w
                .waited_s
                .map(|x| format!(" for {x:.1} s"))
                .unwrap_or_default();
            let whom = if w.waits_for.is_empty() && w.waits_for_ranges.is_empty() {
                "the collective itself".to_string()
            } else {
                format!("rank(s) {}", waits_for_label(w))
            };
            let group = if w.group.is_empty() {
                String::new()
            } else {
                format!(" of {}", clean(&group_label(&w.group, &w.group_desc)))
            };
            let _ = writeln!(
                s,
                "  rank {} in {} seq {}{}{}: waits for {}",
                w.rank,
                clean(&w.op),
                w.seq,
                group,
                waited,
                whom
            );
        }
    }
    if !r.notes.is_empty() {
        let _ = writeln!(s, "\nNotes:");
        for n in &r.notes {
            let _ = writeln!(s, "  - {}", clean(n));
        }
    }
    s
}

/// `rank 3`, or `ranks 16-999999` for a run of ranks that left nothing.
fn who(rank: u32, last: Option<u32>) -> String {
    match last {
        Some(l) => format!("ranks {rank}-{l}"),
        None => format!("rank {rank}"),
    }
}

/// The ranks a waiter waits for, listed ranks and long runs together.
fn waits_for_label(w: &Waiting) -> String {
    let mut parts = Vec::new();
    if !w.waits_for.is_empty() {
        parts.push(crate::compact_ranks(&w.waits_for, 120));
    }
    parts.extend(w.waits_for_ranges.iter().map(|[a, b]| format!("{a}-{b}")));
    parts.join(",")
}

/// The waits-for graph as SVG: culprits on the top row, each waiting rank
/// one row below the farthest rank it waits for.
pub fn waits_for_svg(r: &HangReport) -> String {
    let mut level: BTreeMap<u32, usize> = BTreeMap::new();
    for c in &r.culprits {
        level.insert(c.rank, 0);
    }
    let edges: Vec<(u32, u32)> = r
        .waiting
        .iter()
        .flat_map(|w| w.waits_for.iter().map(move |&t| (w.rank, t)))
        .collect();
    for _ in 0..r.waiting.len() + 1 {
        for &(from, to) in &edges {
            // Culprits stay on top, even inside a cycle of waits.
            if r.culprits.iter().any(|c| c.rank == from) {
                continue;
            }
            let lt = level.get(&to).copied().unwrap_or(0);
            let e = level.entry(from).or_insert(lt + 1);
            if *e < lt + 1 && *e < 64 {
                *e = lt + 1;
            }
        }
    }
    for w in &r.waiting {
        level.entry(w.rank).or_insert(1);
    }
    let mut rows: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for (&rank, &l) in &level {
        rows.entry(l).or_default().push(rank);
    }
    let widest = rows.values().map(Vec::len).max().unwrap_or(1).max(1);
    let (w, h) = (
        (widest as f64 * 90.0 + 40.0).max(300.0),
        rows.len() as f64 * 80.0 + 40.0,
    );
    let mut pos: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for (i, (_, ranks)) in rows.iter().enumerate() {
        let step = w / (ranks.len() as f64 + 1.0);
        for (j, rank) in ranks.iter().enumerate() {
            pos.insert(*rank, (step * (j as f64 + 1.0), 40.0 + i as f64 * 80.0));
        }
    }
    let culprit = |x: u32| r.culprits.iter().any(|c| c.rank == x);
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w:.0}' height='{h:.0}' role='img' aria-label='waits-for graph'>\
<defs><marker id='arrow' viewBox='0 0 10 10' refX='10' refY='5' markerWidth='7' markerHeight='7' orient='auto-start-reverse'><path d='M0,0L10,5L0,10z' fill='#555'/></marker></defs>"
    );
    let drawn: std::collections::BTreeSet<(u32, u32)> = edges.iter().copied().collect();
    for &(from, to) in &drawn {
        let (Some(a), Some(b)) = (pos.get(&from), pos.get(&to)) else {
            continue;
        };
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let len = (dx * dx + dy * dy).sqrt().max(1.0);
        let (ux, uy) = (dx / len * 22.0, dy / len * 22.0);
        // Two ranks that wait for each other (a cycle of waits): each arrow
        // beside the other, not both on one line.
        let (ox, oy) = if drawn.contains(&(to, from)) {
            (-uy / 22.0 * 5.0, ux / 22.0 * 5.0)
        } else {
            (0.0, 0.0)
        };
        let _ = write!(
            s,
            "<line x1='{:.1}' y1='{:.1}' x2='{:.1}' y2='{:.1}' stroke='#555' marker-end='url(#arrow)'/>",
            a.0 + ux + ox,
            a.1 + uy + oy,
            b.0 - ux + ox,
            b.1 - uy + oy
        );
    }
    for (&rank, &(x, y)) in &pos {
        let (fill, stroke) = if culprit(rank) {
            ("#fdd", "#c00")
        } else {
            ("#eef", "#558")
        };
        let _ = write!(
            s,
            "<circle cx='{x:.1}' cy='{y:.1}' r='20' fill='{fill}' stroke='{stroke}' stroke-width='2'/><text x='{x:.1}' y='{:.1}' text-anchor='middle' font-family='sans-serif' font-size='13'>{rank}</text>",
            y + 4.5
        );
    }
    s.push_str("</svg>");
    s
}

/// A collective's tensor sizes in words: `[[192, 192]]` is one 192×192
/// tensor (the Flight Recorder's `input_sizes`).
fn sizes_label(sizes: &[Vec<i64>]) -> String {
    if sizes.is_empty() {
        return String::new();
    }
    let shapes: Vec<String> = sizes
        .iter()
        .map(|d| {
            if d.is_empty() {
                "a scalar".to_string()
            } else {
                d.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join("×")
            }
        })
        .collect();
    format!("on tensor(s) {}", shapes.join(", "))
}

/// A self-contained HTML page (issue 46: the verdict first, then the
/// culprits, what each did, who waits for it, the waits-for graph; stacks
/// collapsed).
pub fn hang_html(title: &str, r: &HangReport) -> String {
    crate::layout::page(title, None, &[], HANG_CSS, hang_html_markup(r))
}

/// What the hang page needs beyond the shared stylesheet.
pub const HANG_CSS: &str = ".culprit{color:#a40e26;font-weight:600}pre{margin:.2em 0}";

/// The hang page's body: the verdict card, the culprits (what each did,
/// who waits for it), the waits-for graph, the waiting ranks, stacks
/// collapsed. The server's job page shows the same ([`hang_html_markup`]
/// as a string, escaped by the engine).
pub fn hang_html_body(r: &HangReport) -> String {
    hang_html_markup(r).into_string()
}

/// [`hang_html_body`] as a [`Markup`] component.
pub fn hang_html_markup(r: &HangReport) -> Markup {
    html! {
        (crate::layout::verdict_card(if r.hang { "hang" } else { "healthy" }, &r.verdict, html! {}))
        @if !r.culprits.is_empty() {
            h2 { "Culprits" }
            table {
                tr {
                    th { "rank" } th { "why" } th { "where" } th { "what it did instead" }
                    th { "waited for by" }
                }
                @for c in &r.culprits { (culprit_row(c)) }
            }
        }
        @if !r.culprits.is_empty() || !r.waiting.is_empty() {
            h2 { "Who waits for whom" }
            p { "An arrow goes from a waiting rank to a rank it waits for; culprits in red." }
            // Numbers only: drawn by waits_for_svg.
            (PreEscaped(waits_for_svg(r)))
        }
        @if !r.waiting.is_empty() {
            (waiting_table(&r.waiting))
        }
        @if !r.notes.is_empty() {
            h2 { "Notes" }
            ul { @for n in &r.notes { li { (n) } } }
        }
    }
}

/// A culprit's row: who, why, in which collective, what it did instead
/// (its stack collapsed), who waits for it.
fn culprit_row(c: &Culprit) -> Markup {
    html! {
        tr {
            td.culprit { (who(c.rank, c.last_rank)) }
            td { (c.reason.as_str().replace('_', " ")) }
            td {
                "group " (group_label(&c.group, &c.group_desc))
                " (ranks " (crate::compact_ranks(&c.group_ranks, 60)) "): "
                (c.op) " #" (c.seq) " " (sizes_label(&c.sizes))
            }
            td {
                (first_sentence_then_more(&c.detail))
                @if let Some(st) = &c.stack {
                    details {
                        summary { "its stack (" (st.thread) " thread, " (st.source) ")" }
                        pre { (stack_text(st)) }
                    }
                }
            }
            td { (crate::compact_ranks(&c.waited_by, 120)) }
        }
    }
}

/// A stack's first frames, one a line.
fn stack_text(st: &ThreadStack) -> String {
    stack_lines(st, 12)
        .iter()
        .map(|l| l.trim_start())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Long text: its first sentence, the rest behind a click.
fn first_sentence_then_more(text: &str) -> Markup {
    let cut = text
        .find(". ")
        .map(|i| i + 1)
        .filter(|&i| i < text.len() && text.len() > 160);
    html! {
        @match cut {
            Some(i) => {
                (text[..i])
                details { summary { "more" } (text[i..].trim_start()) }
            }
            None => (text),
        }
    }
}

/// The waiting ranks, collapsed: each one's group, collective, how long it
/// waited and for whom.
fn waiting_table(waiting: &[Waiting]) -> Markup {
    html! {
        details {
            summary { b { "Waiting ranks" } " (" (waiting.len()) ")" }
            table {
                tr {
                    th { "rank" } th { "group" } th { "collective" } th { "waited" }
                    th { "waits for" }
                }
                @for w in waiting {
                    tr {
                        td { (w.rank) }
                        td { (w.group) }
                        td { (w.op) " #" (w.seq) }
                        td { @if let Some(x) = w.waited_s { (format!("{x:.1} s")) } }
                        td { (waits_for_label(w)) }
                    }
                }
            }
        }
    }
}

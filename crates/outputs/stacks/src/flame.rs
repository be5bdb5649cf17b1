//! SVG flame graphs (SysOM-AI Fig. 6) and differential flame graphs
//! (Fig. 7; Brendan Gregg's red/blue differential flame graphs), written by
//! hand: self-contained, with a little JavaScript for click-to-zoom and
//! search.

use std::fmt::Write as _;

use whyslow_model::stack::{FrameKind, StackProfile};

use crate::tree::Tree;

/// Left and right margin, px.
const XPAD: f64 = 10.0;
/// Where the frames start below the top, px (title and subtitle above).
const TOP: f64 = 52.0;
/// Below the frames: the details line, px.
const BOTTOM: f64 = 34.0;

/// How a flame graph is drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct FlameOptions {
    /// Title at the top.
    pub title: String,
    /// Width of the image, px (at least 200 is used).
    pub width: u32,
    /// Height of one frame, px (4 to 100 is used).
    pub frame_height: u32,
    /// Root at the top and callees below (an icicle graph) instead of the
    /// classic root at the bottom.
    pub icicle: bool,
    /// Frames narrower than this many px are left out (with their callees).
    pub min_width_px: f64,
    /// Differential graphs: how many removed paths (only in the base) are
    /// listed under the graph.
    pub max_removed: usize,
}

impl Default for FlameOptions {
    fn default() -> Self {
        FlameOptions {
            title: "Flame Graph".to_string(),
            width: 1200,
            frame_height: 16,
            icicle: false,
            min_width_px: 0.1,
            max_removed: 25,
        }
    }
}

/// The options made safe to draw with.
struct Geometry {
    width: f64,
    fh: f64,
    font: f64,
    /// Estimated width of one character, px.
    cw: f64,
    min_w: f64,
    icicle: bool,
}

impl Geometry {
    fn new(o: &FlameOptions) -> Self {
        let width = f64::from(o.width.max(200));
        let fh = f64::from(o.frame_height.clamp(4, 100));
        let font = (fh - 4.0).clamp(3.0, 12.0);
        let min_w = if o.min_width_px.is_finite() {
            o.min_width_px.max(0.0)
        } else {
            0.1
        };
        Geometry {
            width,
            fh,
            font,
            cw: font * 0.59,
            min_w,
            icicle: o.icicle,
        }
    }

    /// Width of the graph area.
    fn gw(&self) -> f64 {
        self.width - 2.0 * XPAD
    }

    /// Top of a frame at `depth` when the deepest drawn is `max_depth`.
    fn y(&self, depth: usize, max_depth: usize) -> f64 {
        let row = if self.icicle {
            depth
        } else {
            max_depth.saturating_sub(depth)
        };
        TOP + row as f64 * self.fh
    }
}

/// A frame placed on the graph.
struct Placed {
    node: usize,
    x: f64,
    w: f64,
}

/// The nodes of `tree` at least `min_w` px wide, with their x and width
/// (a node narrower than that is left out with its whole subtree).
fn layout(tree: &Tree, g: &Geometry) -> (Vec<Placed>, usize) {
    let total = tree.total();
    let mut out = Vec::new();
    let mut max_depth = 0;
    if total == 0 {
        return (out, 0);
    }
    let scale = g.gw() / total as f64;
    // (node, samples before it on the x axis)
    let mut stack = vec![(0usize, 0u64)];
    while let Some((node, start)) = stack.pop() {
        let n = &tree.nodes[node];
        let w = n.value as f64 * scale;
        if w < g.min_w {
            continue;
        }
        out.push(Placed {
            node,
            x: XPAD + start as f64 * scale,
            w,
        });
        max_depth = max_depth.max(n.depth);
        let mut offset = start;
        for &c in &n.children {
            stack.push((c, offset));
            offset = offset.saturating_add(tree.nodes[c].value);
        }
    }
    (out, max_depth)
}

/// `text` escaped for XML text and attribute values; characters XML 1.0
/// does not allow become `?`.
pub(crate) fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// `name` cut to fit `w` px (`..` marks a cut), or `None` when fewer than
/// three characters fit.
fn fit_text(name: &str, w: f64, cw: f64) -> Option<String> {
    let max = ((w - 6.0) / cw).floor();
    if max.is_nan() || max < 3.0 {
        return None;
    }
    let max = if max > 1e6 { 1_000_000 } else { max as usize };
    if name.chars().count() <= max {
        Some(name.to_string())
    } else {
        Some(name.chars().take(max - 2).chain("..".chars()).collect())
    }
}

/// FNV-1a of `name`.
fn hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The colour of a frame: a palette per kind, the shade from the name.
fn kind_color(kind: FrameKind, name: &str) -> (u8, u8, u8) {
    let h = hash(name);
    let a = (h & 0xff) as f64 / 255.0;
    let b = ((h >> 8) & 0xff) as f64 / 255.0;
    let c = ((h >> 16) & 0xff) as f64 / 255.0;
    let u = |base: f64, span: f64, v: f64| (base + span * v).round().clamp(0.0, 255.0) as u8;
    match kind {
        // Warm ("hot"): red to orange.
        FrameKind::Native => (u(205.0, 50.0, a), u(0.0, 230.0, b), u(0.0, 55.0, c)),
        // Green to yellow.
        FrameKind::Python => (u(120.0, 110.0, a), u(190.0, 60.0, b), u(40.0, 40.0, c)),
        // Blue.
        FrameKind::Kernel => (u(70.0, 60.0, a), u(130.0, 70.0, b), u(210.0, 45.0, c)),
        // Grey.
        FrameKind::Label => {
            let v = u(165.0, 45.0, a);
            (v, v, v)
        }
    }
}

/// The colour of a change of `delta` percentage points when `scale` pp is
/// full colour: red grew, blue shrank, grey unchanged.
fn diff_color(delta: f64, scale: f64) -> (u8, u8, u8) {
    // NaN fails both comparisons and is grey too.
    let changed = scale > 0.0 && delta.abs() >= 1e-9;
    if !changed {
        return (225, 225, 225);
    }
    let t = (delta.abs() / scale).clamp(0.0, 1.0);
    let v = (235.0 - 205.0 * t).round() as u8;
    if delta > 0.0 {
        (255, v, v)
    } else {
        (v, v, 255)
    }
}

/// `n samples` with the right plural.
fn samples(n: u64) -> String {
    if n == 1 {
        "1 sample".to_string()
    } else {
        format!("{n} samples")
    }
}

/// Percent of `part` in `total` (0 when `total` is 0).
fn pct(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 / total as f64 * 100.0
    }
}

/// Click-to-zoom and search (the frames carry their original x and width
/// in `data-ox`/`data-ow`; a title is `name (…)`).
const SCRIPT: &str = r#"
var details, unzoombtn, matchedtxt, searching = null;
function frames() { return document.getElementById("frames").getElementsByTagName("g"); }
function init(evt) {
  details = document.getElementById("details").firstChild;
  unzoombtn = document.getElementById("unzoom");
  matchedtxt = document.getElementById("matched").firstChild;
  var fs = frames();
  for (var i = 0; i < fs.length; i++) {
    fs[i].onclick = function () { zoom(this); };
    fs[i].onmouseover = function () { details.nodeValue = this.getElementsByTagName("title")[0].textContent; };
    fs[i].onmouseout = function () { details.nodeValue = " "; };
  }
  document.getElementById("search").onclick = function () { search_prompt(); };
  unzoombtn.onclick = function () { unzoom(); };
}
function name_of(g) {
  var t = g.getElementsByTagName("title")[0].textContent;
  var i = t.lastIndexOf(" (");
  return i > 0 ? t.substring(0, i) : t;
}
function fit(g, x, w) {
  var r = g.getElementsByTagName("rect")[0], t = g.getElementsByTagName("text")[0];
  r.setAttribute("x", x.toFixed(2));
  r.setAttribute("width", w.toFixed(2));
  if (!t) return;
  t.setAttribute("x", (x + 3).toFixed(2));
  var n = name_of(g), m = Math.floor((w - 6) / CW);
  if (m < 3) { t.textContent = ""; return; }
  t.textContent = n.length > m ? n.substring(0, m - 2) + ".." : n;
}
function orig(g) {
  return [parseFloat(g.getAttribute("data-ox")), parseFloat(g.getAttribute("data-ow")),
          parseFloat(g.getElementsByTagName("rect")[0].getAttribute("y"))];
}
function zoom(node) {
  var o = orig(node), scale = (W - 2 * XPAD) / o[1], fs = frames();
  unzoombtn.classList.remove("hide");
  for (var i = 0; i < fs.length; i++) {
    var g = fs[i], p = orig(g), anc = ICICLE ? p[2] < o[2] : p[2] > o[2];
    g.classList.remove("hide");
    g.classList.remove("parent");
    if (anc && p[0] <= o[0] + 0.005 && p[0] + p[1] >= o[0] + o[1] - 0.005) {
      g.classList.add("parent");
      fit(g, XPAD, W - 2 * XPAD);
    } else if (!anc && p[0] >= o[0] - 0.005 && p[0] + p[1] <= o[0] + o[1] + 0.005) {
      fit(g, XPAD + (p[0] - o[0]) * scale, p[1] * scale);
    } else {
      g.classList.add("hide");
    }
  }
}
function unzoom() {
  unzoombtn.classList.add("hide");
  var fs = frames();
  for (var i = 0; i < fs.length; i++) {
    var p = orig(fs[i]);
    fs[i].classList.remove("hide");
    fs[i].classList.remove("parent");
    fit(fs[i], p[0], p[1]);
  }
}
function reset_search() {
  var fs = frames();
  for (var i = 0; i < fs.length; i++) {
    var r = fs[i].getElementsByTagName("rect")[0];
    if (r.hasAttribute("data-fill")) { r.setAttribute("fill", r.getAttribute("data-fill")); r.removeAttribute("data-fill"); }
  }
  searching = null;
  matchedtxt.nodeValue = " ";
}
function search_prompt() {
  if (searching !== null) { reset_search(); return; }
  var term = prompt("Search frames (regular expression):", "");
  if (term) search(term);
}
function search(term) {
  var re;
  try { re = new RegExp(term); } catch (e) { return; }
  var fs = frames(), spans = [];
  for (var i = 0; i < fs.length; i++) {
    if (!re.test(name_of(fs[i]))) continue;
    var r = fs[i].getElementsByTagName("rect")[0], p = orig(fs[i]);
    r.setAttribute("data-fill", r.getAttribute("fill"));
    r.setAttribute("fill", "rgb(230,0,230)");
    spans.push([p[0], p[0] + p[1]]);
  }
  spans.sort(function (a, b) { return a[0] - b[0]; });
  var covered = 0, end = -1;
  for (var k = 0; k < spans.length; k++) {
    if (spans[k][0] >= end) { covered += spans[k][1] - spans[k][0]; end = spans[k][1]; }
    else if (spans[k][1] > end) { covered += spans[k][1] - end; end = spans[k][1]; }
  }
  searching = term;
  matchedtxt.nodeValue = "Matched: " + (100 * covered / (W - 2 * XPAD)).toFixed(1) + "%";
}
"#;

/// The SVG up to and including the opening of `<g id="frames">`.
fn header(out: &mut String, g: &Geometry, height: f64, title: &str, subtitle: &str, diff: bool) {
    let w = g.width;
    let _ = write!(
        out,
        concat!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n",
            "<svg version=\"1.1\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" ",
            "onload=\"init(evt)\" xmlns=\"http://www.w3.org/2000/svg\">\n",
            "<!-- Flame graph written by whyslow (SysOM-AI Fig. 6-7). -->\n",
            "<defs>\n",
            "<linearGradient id=\"background\" y1=\"0\" y2=\"1\" x1=\"0\" x2=\"0\">",
            "<stop stop-color=\"#eeeeee\" offset=\"5%\"/><stop stop-color=\"{bg}\" offset=\"95%\"/>",
            "</linearGradient>\n"
        ),
        w = w,
        h = height,
        bg = if diff { "#e0e0f0" } else { "#eeeeb0" },
    );
    if diff {
        out.push_str(concat!(
            "<pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" ",
            "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"rgb(225,232,255)\"/>",
            "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"rgb(60,80,220)\" stroke-width=\"2\"/>",
            "</pattern>\n"
        ));
    }
    let _ = write!(
        out,
        concat!(
            "</defs>\n<style type=\"text/css\">\n",
            "text {{ font-family: Verdana, sans-serif; font-size: {font}px; fill: rgb(0,0,0); }}\n",
            "#title {{ text-anchor: middle; font-size: 17px; }}\n",
            "#subtitle {{ text-anchor: middle; fill: rgb(90,90,90); }}\n",
            "#search, #unzoom {{ cursor: pointer; opacity: 0.6; }}\n",
            "#search:hover, #unzoom:hover {{ opacity: 1; }}\n",
            ".f:hover rect {{ stroke: rgb(0,0,0); stroke-width: 0.5; }}\n",
            ".f {{ cursor: pointer; }}\n",
            ".hide {{ display: none; }}\n",
            ".parent {{ opacity: 0.5; }}\n",
            "</style>\n",
            "<script type=\"text/ecmascript\"><![CDATA[\n",
            "var W = {w}, XPAD = {xpad}, ICICLE = {icicle}, CW = {cw:.3};",
            "{script}]]></script>\n",
            "<rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"url(#background)\"/>\n",
            "<text id=\"title\" x=\"{mid}\" y=\"24\">{title}</text>\n",
            "<text id=\"subtitle\" x=\"{mid}\" y=\"42\">{subtitle}</text>\n",
            "<text id=\"unzoom\" class=\"hide\" x=\"{xpad}\" y=\"24\">Reset Zoom</text>\n",
            "<text id=\"search\" x=\"{sx}\" y=\"24\">Search</text>\n",
            "<text id=\"matched\" x=\"{sx}\" y=\"{dy}\"> </text>\n",
            "<text id=\"details\" x=\"{xpad}\" y=\"{dy}\"> </text>\n",
            "<g id=\"frames\">\n"
        ),
        font = g.font,
        w = w,
        h = height,
        xpad = XPAD,
        icicle = g.icicle,
        cw = g.cw,
        script = SCRIPT,
        mid = w / 2.0,
        title = xml_escape(title),
        subtitle = xml_escape(subtitle),
        sx = w - XPAD - 110.0,
        dy = height - 12.0,
    );
}

/// One frame: `<g class="f">` with its tooltip, box and label.
fn frame(
    out: &mut String,
    g: &Geometry,
    p: &Placed,
    y: f64,
    name: &str,
    title: &str,
    rgb: (u8, u8, u8),
) {
    let _ = writeln!(
        out,
        "<g class=\"f\" data-ox=\"{x:.3}\" data-ow=\"{w:.3}\"><title>{title}</title>\
         <rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{h:.1}\" fill=\"rgb({r},{gr},{b})\" rx=\"2\" ry=\"2\"/>\
         <text x=\"{tx:.2}\" y=\"{ty:.1}\">{text}</text></g>",
        x = p.x,
        w = p.w,
        title = xml_escape(title),
        y = y,
        h = g.fh - 1.0,
        r = rgb.0,
        gr = rgb.1,
        b = rgb.2,
        tx = p.x + 3.0,
        ty = y + g.fh - 4.5,
        text = fit_text(name, p.w, g.cw)
            .map(|t| xml_escape(&t))
            .unwrap_or_default(),
    );
}

/// Graph height for frames down to `max_depth` (or one row for a message).
fn graph_height(g: &Geometry, any: bool, max_depth: usize) -> f64 {
    if any {
        (max_depth as f64 + 1.0) * g.fh
    } else {
        2.0 * g.fh
    }
}

/// "No samples" where the frames would be.
fn no_samples(out: &mut String, g: &Geometry) {
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">No samples</text>",
        g.width / 2.0,
        TOP + g.fh
    );
}

/// A flame graph of `profile` as a self-contained SVG document (SysOM-AI
/// Fig. 6).
///
/// Stacks are merged by the path of displayed names
/// ([`Frame::display`](whyslow_model::stack::Frame::display)) from the
/// root; siblings are
/// sorted by name, so equal profiles give equal SVG. The root `all` spans
/// the whole width and each frame's width is proportional to its inclusive
/// samples; frames narrower than [`FlameOptions::min_width_px`] are left out
/// with their callees. The root is at the bottom, or at the top with
/// [`FlameOptions::icicle`]. Each frame has a tooltip `name (N samples,
/// P%)` and a label cut to fit its box; colours go by kind (native warm
/// red/orange, Python green/yellow, kernel blue, labels grey) with a shade
/// from a hash of the name. Clicking a frame zooms to it; "Search"
/// highlights frames matching a regular expression.
pub fn to_flamegraph_svg(profile: &StackProfile, options: &FlameOptions) -> String {
    let g = Geometry::new(options);
    let tree = Tree::build(profile);
    let total = tree.total();
    let (placed, max_depth) = layout(&tree, &g);
    let height = TOP + graph_height(&g, !placed.is_empty(), max_depth) + BOTTOM;

    let mut subtitle = samples(total);
    if let Some(hz) = profile.usable_hz() {
        let _ = write!(subtitle, " at {hz} Hz");
    }
    if profile.duration_ns > 0 {
        let _ = write!(subtitle, " over {:.2} s", profile.duration_ns as f64 / 1e9);
    }
    for (k, v) in &profile.labels {
        if subtitle.len() > 200 {
            subtitle.push_str(" …");
            break;
        }
        let _ = write!(subtitle, " · {k}={v}");
    }

    let mut out = String::new();
    header(&mut out, &g, height, &options.title, &subtitle, false);
    if placed.is_empty() {
        no_samples(&mut out, &g);
    }
    for p in &placed {
        let n = &tree.nodes[p.node];
        let title = format!(
            "{} ({}, {:.2}%)",
            n.name,
            samples(n.value),
            pct(n.value, total)
        );
        let y = g.y(n.depth, max_depth);
        frame(
            &mut out,
            &g,
            p,
            y,
            &n.name,
            &title,
            kind_color(n.kind, &n.name),
        );
    }
    out.push_str("</g>\n</svg>\n");
    out
}

/// A differential flame graph of `base` → `new` as a self-contained SVG
/// document (SysOM-AI Fig. 7; Brendan Gregg's red/blue differential flame
/// graphs).
///
/// The layout and widths are those of [`to_flamegraph_svg`] for `new`.
/// Each frame's colour shows how its inclusive **share** of all samples
/// (so profiles with different sample counts compare) changed from `base`
/// (the same path of names from the root) to `new`: red when it grew,
/// blue when it shrank, full colour at the largest change in the graph
/// (saturation proportional to the change), light grey when unchanged.
/// Frames only in `new` count as grown from 0%. Tooltips read
/// `name (N samples, base% → new%, +Δ pp)`.
///
/// Paths only in `base` (removed: nothing of them was sampled in `new`)
/// cannot take width in `new`'s layout; the topmost removed frame of each
/// is listed under the graph, largest first (at most
/// [`FlameOptions::max_removed`]), as a blue dashed-outline, hatched bar
/// whose width is its share of `base` on the graph's scale, labelled with
/// the change and its path (leaf first), with a tooltip giving the whole
/// path root first and `base% → 0.00%`.
pub fn to_diff_flamegraph_svg(
    base: &StackProfile,
    new: &StackProfile,
    options: &FlameOptions,
) -> String {
    let g = Geometry::new(options);
    let new_tree = Tree::build(new);
    let base_tree = Tree::build(base);
    let (nt, bt) = (new_tree.total(), base_tree.total());
    let (placed, max_depth) = layout(&new_tree, &g);
    let in_base = new_tree.match_in(&base_tree);
    let in_new = base_tree.match_in(&new_tree);
    let base_parents = base_tree.parents();

    let share_delta = |node: usize| -> (f64, f64, f64) {
        let s_new = pct(new_tree.nodes[node].value, nt);
        let s_base = in_base[node].map_or(0.0, |b| pct(base_tree.nodes[b].value, bt));
        (s_base, s_new, s_new - s_base)
    };
    // Removed: base nodes missing in new whose parent is present.
    let mut removed: Vec<usize> = (1..base_tree.nodes.len())
        .filter(|&b| in_new[b].is_none() && in_new[base_parents[b]].is_some())
        .collect();
    let removed_share = |b: usize| pct(base_tree.nodes[b].value, bt);
    let removed_total: u64 = removed
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(base_tree.nodes[b].value));

    let mut scale = 0.0f64;
    for p in &placed {
        scale = scale.max(share_delta(p.node).2.abs());
    }
    for &b in &removed {
        scale = scale.max(removed_share(b));
    }

    removed.sort_by(|&a, &b| {
        base_tree.nodes[b]
            .value
            .cmp(&base_tree.nodes[a].value)
            .then_with(|| {
                base_tree
                    .path(a, &base_parents)
                    .cmp(&base_tree.path(b, &base_parents))
            })
    });
    let listed = removed.len().min(options.max_removed);
    let row = g.fh + 2.0;
    let graph_bottom = TOP + graph_height(&g, !placed.is_empty(), max_depth);
    let removed_height = if removed.is_empty() {
        0.0
    } else {
        28.0 + row * listed as f64 + if listed < removed.len() { row } else { 0.0 }
    };
    let height = graph_bottom + removed_height + BOTTOM;

    let subtitle = format!(
        "base {} → new {}; widths: new; colour: change of inclusive share, red grew, blue shrank (full colour at ±{:.2} pp)",
        samples(bt),
        samples(nt),
        scale
    );
    let mut out = String::new();
    header(&mut out, &g, height, &options.title, &subtitle, true);
    if placed.is_empty() {
        no_samples(&mut out, &g);
    }
    for p in &placed {
        let n = &new_tree.nodes[p.node];
        let (sb, sn, d) = share_delta(p.node);
        let title = format!(
            "{} ({}, {sb:.2}% → {sn:.2}%, {d:+.2} pp)",
            n.name,
            samples(n.value)
        );
        let y = g.y(n.depth, max_depth);
        frame(&mut out, &g, p, y, &n.name, &title, diff_color(d, scale));
    }
    out.push_str("</g>\n");

    if !removed.is_empty() {
        let y0 = graph_bottom + 22.0;
        let _ = writeln!(
            out,
            "<g id=\"removed\">\n<text x=\"{XPAD}\" y=\"{y0:.1}\">Only in base (removed): {} path{}, {:.2}% of base samples</text>",
            removed.len(),
            if removed.len() == 1 { "" } else { "s" },
            pct(removed_total, bt),
        );
        let gw = g.gw();
        for (k, &b) in removed.iter().take(listed).enumerate() {
            let y = y0 + 8.0 + row * k as f64;
            let share = removed_share(b);
            let w = (share / 100.0 * gw).clamp(2.0, gw);
            let path = base_tree.path(b, &base_parents);
            let title = format!(
                "{} ({share:.2}% → 0.00%, {:+.2} pp)",
                path.join(";"),
                -share
            );
            let leaf_first: Vec<&str> = path.iter().rev().copied().collect();
            let label = format!("{:+.2} pp  {}", -share, leaf_first.join(" ← "));
            let text_x = XPAD + w + 6.0;
            let text = fit_text(&label, XPAD + gw - text_x + 6.0, g.cw)
                .map(|t| xml_escape(&t))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "<g class=\"removed\"><title>{title}</title><rect x=\"{XPAD}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{h:.1}\" \
                 fill=\"url(#hatch)\" stroke=\"rgb(40,60,200)\" stroke-width=\"1\" stroke-dasharray=\"3,2\"/>\
                 <text x=\"{text_x:.2}\" y=\"{ty:.1}\">{text}</text></g>",
                title = xml_escape(&title),
                h = g.fh - 1.0,
                ty = y + g.fh - 4.5,
            );
        }
        if listed < removed.len() {
            let y = y0 + 8.0 + row * listed as f64 + g.fh - 4.5;
            let _ = writeln!(
                out,
                "<text x=\"{XPAD}\" y=\"{y:.1}\">… and {} more</text>",
                removed.len() - listed
            );
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_on_characters_not_bytes() {
        assert_eq!(
            fit_text("ééééééééééé", 6.0 + 5.0 * 7.0, 7.0).unwrap(),
            "ééé.."
        );
        assert_eq!(fit_text("abc", 6.0 + 3.0 * 7.0, 7.0).unwrap(), "abc");
        assert_eq!(fit_text("abcdef", 10.0, 7.0), None);
        assert_eq!(fit_text("abcdef", f64::NAN, 7.0), None);
    }

    #[test]
    fn escaping_covers_markup_and_control_characters() {
        assert_eq!(xml_escape("a<b>&\"'\u{1}"), "a&lt;b&gt;&amp;&quot;&apos;?");
    }

    #[test]
    fn diff_colours_run_from_grey_to_red_and_blue() {
        assert_eq!(diff_color(0.0, 5.0), (225, 225, 225));
        assert_eq!(diff_color(5.0, 5.0), (255, 30, 30));
        assert_eq!(diff_color(-5.0, 5.0), (30, 30, 255));
        assert_eq!(diff_color(1.0, 0.0), (225, 225, 225));
    }
}

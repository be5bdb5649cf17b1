//! One layout for every page whyslow draws (issue 46): the `analyze`,
//! `diagnose`, `hang` and flows reports the command line writes, and the
//! server's pages. One stylesheet, one navigation bar, the verdict card
//! first; templates are [`maud`] macros, compiled into the binary, and
//! every value put into them is escaped by the engine (maud rather than
//! askama: components are plain Rust functions that return [`Markup`], so
//! the command line's reports and the server share them without template
//! files or a runtime loader).

use maud::{html, Markup, PreEscaped, DOCTYPE};

/// The stylesheet every page starts from. Readable at 1400 px and on a
/// phone, nothing wider than the window (wide tables and text scroll inside
/// their own box, not the page), a visible keyboard focus, and text colors
/// at WCAG AA contrast (4.5:1 or more) on their backgrounds.
pub const CSS: &str = "\
*{box-sizing:border-box}\
body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1f2328;background:#fff}\
nav.top{background:#24292f;padding:.55em 1.5em;display:flex;gap:1.2em;flex-wrap:wrap;align-items:baseline}\
nav.top a,nav.top span{color:#fff;text-decoration:none}nav.top .brand{font-weight:700}\
nav.top a:hover{text-decoration:underline}nav.top a:focus-visible{outline-color:#fff}\
nav.top form{margin:0 0 0 auto}\
main{padding:1em 1.5em;max-width:1320px}\
h1{font-size:1.45em;margin:.3em 0 .4em;overflow-wrap:anywhere}h2{font-size:1.15em;margin:1.3em 0 .4em}\
h3{font-size:1em;margin:1em 0 .3em}\
a{color:#0550ae}\
a:focus-visible,button:focus-visible,summary:focus-visible,input:focus-visible,select:focus-visible{outline:3px solid #0969da;outline-offset:2px}\
table{border-collapse:collapse;margin:.5em 0;display:block;max-width:100%;overflow-x:auto}\
td,th{border-bottom:1px solid #d0d7de;padding:.35em .8em;text-align:left;vertical-align:top;overflow-wrap:break-word}\
th{background:#eef1f4;white-space:nowrap}th a{color:inherit}\
pre{background:#f6f8fa;border:1px solid #d0d7de;padding:.6em;white-space:pre-wrap;overflow-wrap:anywhere;font-size:13px}\
code{overflow-wrap:anywhere}svg{max-width:100%;height:auto}\
details{margin:.4em 0}summary{cursor:pointer}\
.muted,.meta{color:#57606a}.error{color:#b00020}\
.verdict{border-left:.4em solid #6b7280;background:#f6f8fa;padding:.6em 1em;margin:.8em 0 1.2em;font-size:1.05em}\
.verdict p{margin:.3em 0}.verdict .headline{font-weight:700}\
.verdict.slow{border-color:#b45309}.verdict.hang{border-color:#b00020}.verdict.healthy{border-color:#15803d}\
.badge{display:inline-block;padding:.05em .55em;border-radius:.7em;font-size:.85em;font-weight:600;color:#fff;background:#57606a}\
.badge.hang{background:#b00020}.badge.slow{background:#9a3412}.badge.healthy{background:#15803d}\
.bar{display:inline-block;height:.7em;background:#b45309;vertical-align:middle}.bar.peers{background:#8c959f}\
iframe.flame{width:100%;height:620px;border:1px solid #d0d7de}\
.filter{margin:.5em 0 1em}";

/// A link in the navigation bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NavLink {
    /// Where it goes.
    pub href: String,
    /// What it says.
    pub label: String,
}

impl NavLink {
    /// A link.
    pub fn new(href: impl Into<String>, label: impl Into<String>) -> Self {
        Self {
            href: href.into(),
            label: label.into(),
        }
    }
}

/// A page's navigation bar: where the brand links (`home`; none for a
/// report file), then `links`, then `actions` (controls at the bar's right
/// end, such as the server's fix button).
#[derive(Debug, Clone, Default)]
pub struct Nav {
    /// Where the brand links.
    pub home: Option<String>,
    /// The links after it.
    pub links: Vec<NavLink>,
    /// Controls at the bar's right end.
    pub actions: Option<Markup>,
}

/// A whole page: the navigation bar (`home`: where the brand links, none
/// for a report file; then `links`), the title as the page's heading, the
/// shared stylesheet plus `extra_css`, then `body`.
pub fn page(
    title: &str,
    home: Option<&str>,
    links: &[NavLink],
    extra_css: &str,
    body: Markup,
) -> String {
    let nav = Nav {
        home: home.map(str::to_string),
        links: links.to_vec(),
        actions: None,
    };
    page_in(&nav, title, extra_css, body)
}

/// [`page`] under the navigation bar `nav`.
pub fn page_in(nav: &Nav, title: &str, extra_css: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · whyslow" }
                style { (PreEscaped(CSS)) (PreEscaped(extra_css)) }
            }
            body {
                (nav_bar(nav))
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
    .into_string()
        + "\n"
}

/// The navigation bar.
fn nav_bar(nav: &Nav) -> Markup {
    html! {
        nav.top aria-label="whyslow" {
            @match &nav.home {
                Some(h) => a.brand href=(h) { "whyslow" },
                None => span.brand { "whyslow" },
            }
            @for l in &nav.links {
                a href=(l.href) { (l.label) }
            }
            @if let Some(a) = &nav.actions {
                (a)
            }
        }
    }
}

/// The verdict card that opens a page: `health` is its class (`slow`,
/// `hang`, `healthy`, `unknown`), `headline` the sentence that says what
/// is wrong, `details` what backs it.
pub fn verdict_card(health: &str, headline: &str, details: Markup) -> Markup {
    html! {
        section.verdict.(health) aria-label="verdict" {
            p.headline { (headline) }
            (details)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_escapes_what_it_is_given_and_links_its_nav() {
        let p = page(
            "job <x>",
            Some("/ui/"),
            &[NavLink::new("/ui/logout", "sign out")],
            "",
            verdict_card("slow", "rank 2 & more", html! { p { "<b>" } }),
        );
        assert!(p.starts_with("<!DOCTYPE html>"));
        assert!(p.contains("<title>job &lt;x&gt; · whyslow</title>"));
        assert!(
            p.contains(r#"<a class="brand" href="/ui/">whyslow</a>"#),
            "{p}"
        );
        assert!(p.contains(r#"<a href="/ui/logout">sign out</a>"#));
        assert!(
            p.contains(r#"<section class="verdict slow" aria-label="verdict">"#),
            "{p}"
        );
        assert!(p.contains("rank 2 &amp; more"));
        assert!(p.contains("<p>&lt;b&gt;</p>"));
        let with_actions = page_in(
            &Nav {
                home: Some("/ui/".into()),
                links: vec![NavLink::new("/ui/", "Jobs")],
                actions: Some(html! { form method="post" action="/x" { button { "Ask" } } }),
            },
            "t",
            "",
            html! {},
        );
        assert!(
            with_actions.contains(
                r#"<a href="/ui/">Jobs</a><form method="post" action="/x"><button>Ask</button></form></nav>"#
            ),
            "{with_actions}"
        );
        let file = page("r", None, &[], "x{}", html! { i { "ok" } });
        assert!(file.contains(r#"<span class="brand">whyslow</span>"#));
        assert!(file.contains("<i>ok</i>"));
    }
}

//! Text from clients (lock names, holders, metadata, namespaces, token
//! names) as the dashboard shows it: control characters, the
//! bidirectional formatting characters and invisible ones are written as
//! `\u{202E}`, so `pay\u{202E}gnp.exe` cannot pass for `payexe.png` and
//! two names that differ only by an invisible character do not look the
//! same. The escapes are marked (`<span class="esc">`), so they are told
//! apart from a name that holds the text `\u{202E}` itself.
//!
//! Where it happens: app.js (`visible`, the same characters) for
//! everything the live pages render from `/api/v1`, and the `visible`
//! filter here for what the server renders itself (the admin pages,
//! notices, the shell). The JSON and the forms' hidden fields keep the
//! text as it is, so the names still reach the API unchanged.

use std::fmt::Write;

/// Whether `c` is shown escaped: C0 and C1 controls and DEL; the bidi
/// controls (ALM, LRM, RLM, LRE/RLE/PDF/LRO/RLO, LRI/RLI/FSI/PDI); and
/// the invisible zero width space, word joiner, BOM and line/paragraph
/// separators. Zero width (non-)joiners are left alone: scripts such as
/// Persian and the Indic ones need them inside words.
pub fn is_hidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1F}'
        | '\u{7F}'..='\u{9F}'
        | '\u{61C}'
        | '\u{200B}'
        | '\u{200E}'
        | '\u{200F}'
        | '\u{2028}'..='\u{202E}'
        | '\u{2060}'
        | '\u{2066}'..='\u{2069}'
        | '\u{FEFF}')
}

/// `text` as HTML: escaped for HTML, each hidden character as a marked
/// `<span class="esc" title="U+202E">\u{202E}</span>`.
pub fn visible_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&#38;"),
            '<' => out.push_str("&#60;"),
            '>' => out.push_str("&#62;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c if is_hidden(c) => {
                let code = c as u32;
                let _ = write!(
                    out,
                    "<span class=\"esc\" title=\"U+{code:04X}\">\\u{{{code:X}}}</span>"
                );
            }
            c => out.push(c),
        }
    }
    out
}

/// The templates' filters (askama finds them by this module's name).
pub mod filters {
    /// `{{ name|visible }}`: [`super::visible_html`], already escaped.
    #[askama::filter_fn]
    pub fn visible<T: std::fmt::Display>(
        text: T,
        _: &dyn askama::Values,
    ) -> askama::Result<askama::filters::Safe<String>> {
        Ok(askama::filters::Safe(super::visible_html(
            &text.to_string(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a reader sees of `visible_html`'s output.
    fn text(html: &str) -> String {
        let mut out = String::new();
        let mut rest = html;
        while let Some(at) = rest.find('<') {
            out.push_str(&rest[..at]);
            rest = &rest[rest[at..].find('>').unwrap() + at + 1..];
        }
        out + rest
    }

    #[test]
    fn hidden_characters_are_written_out_and_the_rest_kept() {
        assert_eq!(
            text(&visible_html("pay\u{202E}gnp.exe")),
            "pay\\u{202E}gnp.exe"
        );
        assert_eq!(
            text(&visible_html(
                "a\u{0}b\u{1B}c\u{7F}d\u{85}e\u{200B}f\u{2066}g\u{FEFF}h\u{61C}i\u{2028}"
            )),
            "a\\u{0}b\\u{1B}c\\u{7F}d\\u{85}e\\u{200B}f\\u{2066}g\\u{FEFF}h\\u{61C}i\\u{2028}"
        );
        // Ordinary non-ASCII text, and joiners inside words, stay.
        for kept in [
            "jobs/nightly",
            "Grüße — ok",
            "日本語",
            "می\u{200C}خواهم",
            "👩\u{200D}💻",
        ] {
            assert_eq!(visible_html(kept), kept);
        }
    }

    #[test]
    fn html_is_escaped_and_escapes_are_marked() {
        assert_eq!(
            visible_html("<b>\"x\"&'\u{202E}"),
            "&#60;b&#62;&#34;x&#34;&#38;&#39;<span class=\"esc\" title=\"U+202E\">\\u{202E}</span>"
        );
        assert_eq!(
            visible_html("\u{9}"),
            "<span class=\"esc\" title=\"U+0009\">\\u{9}</span>"
        );
    }
}

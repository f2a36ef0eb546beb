//! The SVG of a neighbourhood: rows by level, boxes of fixed width, straight edges.
//!
//! Only elements that draw (`svg`, `title`, `g`, `rect`, `line`, `text`, `tspan`) and
//! attributes that place and colour them are written; every text goes through
//! [`xml_escape`]. So the picture holds no script, event handler or link whatever the
//! facts' fields hold.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Neighbourhood, label_lines};
use crate::hash::FactHash;

const BOX_W: i64 = 260;
const LINE_H: i64 = 16;
const PAD: i64 = 8;
const GAP_X: i64 = 24;
const GAP_Y: i64 = 48;

/// Escapes text for XML content and attribute values.
pub(crate) fn xml_escape(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => s.push_str("&lt;"),
            '>' => s.push_str("&gt;"),
            '&' => s.push_str("&amp;"),
            '"' => s.push_str("&quot;"),
            '\'' => s.push_str("&#39;"),
            // Not allowed in XML 1.0 at all.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => s.push('\u{FFFD}'),
            c => s.push(c),
        }
    }
    s
}

/// Where each node's box is: its top-left corner and height.
struct Placed {
    x: i64,
    y: i64,
    h: i64,
    lines: Vec<String>,
    center: bool,
}

pub(super) fn render(n: &Neighbourhood) -> String {
    // Rows by level, in the nodes' order (level, type, hash).
    let mut rows: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, node) in n.nodes.iter().enumerate() {
        rows.entry(node.level).or_default().push(i);
    }
    let widest = rows.values().map(Vec::len).max().unwrap_or(1) as i64;
    let width = widest * (BOX_W + GAP_X) + GAP_X;
    let mut placed: BTreeMap<FactHash, Placed> = BTreeMap::new();
    let mut y = GAP_Y / 2;
    for row in rows.values() {
        let row_w = row.len() as i64 * (BOX_W + GAP_X) - GAP_X;
        let mut x = (width - row_w) / 2;
        let mut row_h = 0;
        for &i in row {
            let node = &n.nodes[i];
            let lines = label_lines(&node.fact);
            let h = lines.len() as i64 * LINE_H + 2 * PAD;
            row_h = row_h.max(h);
            placed.insert(
                node.fact.hash(),
                Placed {
                    x,
                    y,
                    h,
                    lines,
                    center: node.level == 0,
                },
            );
            x += BOX_W + GAP_X;
        }
        y += row_h + GAP_Y;
    }
    let height = y - GAP_Y / 2;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"monospace\" font-size=\"12\">"
    );
    let _ = writeln!(
        s,
        "<title>neighbourhood of {}</title>",
        xml_escape(&n.center.to_string())
    );
    for e in &n.edges {
        let (Some(a), Some(b)) = (placed.get(&e.from), placed.get(&e.to)) else {
            continue;
        };
        // From the top of the successor's box to the bottom of the predecessor's.
        let (x1, y1) = (a.x + BOX_W / 2, a.y);
        let (x2, y2) = (b.x + BOX_W / 2, b.y + b.h);
        let _ = writeln!(
            s,
            "<g class=\"edge\"><title>{}</title><line x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\" stroke=\"#555\"/><text x=\"{}\" y=\"{}\" fill=\"#555\">{}</text></g>",
            xml_escape(&format!(
                "{} -{}-> {}",
                e.from.short(8),
                e.role,
                e.to.short(8)
            )),
            (x1 + x2) / 2 + 4,
            (y1 + y2) / 2,
            xml_escape(&e.role)
        );
    }
    for (h, p) in &placed {
        let stroke = if p.center { "3" } else { "1" };
        let _ = write!(
            s,
            "<g class=\"node\"><title>{}</title><rect x=\"{}\" y=\"{}\" width=\"{BOX_W}\" height=\"{}\" fill=\"#fff\" stroke=\"#222\" stroke-width=\"{stroke}\"/>",
            xml_escape(&h.to_string()),
            p.x,
            p.y,
            p.h
        );
        for (i, line) in p.lines.iter().enumerate() {
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{}\">{}</text>",
                p.x + PAD,
                p.y + PAD + (i as i64 + 1) * LINE_H - 4,
                xml_escape(line)
            );
        }
        s.push_str("</g>\n");
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::xml_escape;

    #[test]
    fn markup_and_quotes_come_out_as_text() {
        assert_eq!(
            xml_escape("<script>\"a\" & 'b'</script>"),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
        assert_eq!(xml_escape("a\u{1}b"), "a\u{FFFD}b");
    }
}

//! `precedent graph HASH`: a fact's neighbourhood as Graphviz dot, SVG or JSON.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::Context;
use clap::{Args, ValueEnum};
use precedent::graph::Neighbourhood;

use super::{Global, Status};

/// `precedent graph`.
#[derive(Args, Debug)]
pub struct GraphArgs {
    /// A full hash or a prefix of at least 8 hex digits of a released fact.
    pub hash: String,
    /// Levels of ancestors above and of descendants below the fact.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub depth: u32,
    /// dot (Graphviz), svg (through Graphviz's `dot` when it is installed, else laid
    /// out in rows by precedent itself) or json.
    #[arg(long, value_enum, default_value_t = GraphFormat::Dot)]
    pub format: GraphFormat,
}

/// What `precedent graph` writes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphFormat {
    /// Graphviz dot.
    Dot,
    /// SVG.
    Svg,
    /// JSON: nodes with level and label, edges with role.
    Json,
}

pub fn graph(g: &Global, a: GraphArgs) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let hash = store.resolve(&a.hash)?;
    let n = Neighbourhood::walk(&store, &hash, a.depth)?;
    if n.truncated {
        tracing::warn!(
            "the neighbourhood has more than {} facts; showing the nearest",
            Neighbourhood::MAX_NODES
        );
    }
    let text = match a.format {
        GraphFormat::Dot => n.to_dot(),
        GraphFormat::Json => format!("{}\n", n.to_json()),
        GraphFormat::Svg => match graphviz_svg(&n.to_dot()) {
            Some(svg) => svg,
            None => n.to_svg(),
        },
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing the graph")?;
    Ok(Status::Ok)
}

/// The SVG Graphviz's `dot` draws of `dot_text`, when `dot -V` runs; `None` otherwise
/// (or when it fails, which is logged).
fn graphviz_svg(dot_text: &str) -> Option<String> {
    let found = Command::new("dot")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        return None;
    }
    let run = || -> std::io::Result<std::process::Output> {
        let mut child = Command::new("dot")
            .arg("-Tsvg")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(dot_text.as_bytes())?;
        child.wait_with_output()
    };
    match run() {
        Ok(out) if out.status.success() => String::from_utf8(out.stdout).ok(),
        Ok(out) => {
            tracing::warn!(
                "dot -Tsvg failed ({}); laying the graph out without it: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Err(e) => {
            tracing::warn!("cannot run dot -Tsvg ({e}); laying the graph out without it");
            None
        }
    }
}

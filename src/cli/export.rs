//! `export`: released facts in release order, streamed as JSON Lines or a CBOR sequence.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use precedent::{Error, FactHash, encoding, json};

use super::args::Format;
use super::{Global, Status};

/// `precedent export [--format json|cbor] [--after SEQ] [-o FILE]`.
pub fn export(
    g: &Global,
    format: Format,
    after: i64,
    output: Option<&Path>,
) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let (sink, name): (Box<dyn Write>, String) = match output {
        Some(p) if p != Path::new("-") => (
            // The caller's path to fix (exit 1), not a database error.
            Box::new(
                File::create(p)
                    .map_err(|e| super::unreadable(format!("cannot create {}", p.display()), &e))?,
            ),
            p.display().to_string(),
        ),
        _ => (Box::new(io::stdout().lock()), "stdout".to_string()),
    };
    let mut out = BufWriter::with_capacity(1 << 16, sink);
    store
        .for_each_released(after, |_seq, hash, bytes| {
            match format {
                Format::Json => {
                    let fact =
                        encoding::decode_fact(bytes, Some(hash)).map_err(|e| Error::Corrupt {
                            hash,
                            reason: e.to_string(),
                        })?;
                    serde_json::to_writer(&mut out, &json::to_json(&fact))
                        .map_err(io::Error::from)?;
                    out.write_all(b"\n")?;
                }
                Format::Cbor => {
                    let actual = FactHash::of_canonical(bytes);
                    if actual != hash {
                        return Err(Error::Corrupt {
                            hash,
                            reason: format!("stored bytes hash to {actual}"),
                        });
                    }
                    out.write_all(bytes)?;
                }
            }
            Ok(())
        })
        .with_context(|| format!("export to {name} failed"))?;
    out.flush()
        .with_context(|| format!("export to {name} failed"))?;
    Ok(Status::Ok)
}

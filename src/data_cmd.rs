//! `loco data prepare`: the command around [`loco_real::prepare`], and its summary.

use crate::InputError;
use crate::cli::PrepareArgs;
use crate::human;
use anyhow::Result;
use loco_real::prepare::{PrepareError, PrepareOptions, PrepareReport};
use std::io::Write;

/// Runs `loco data prepare` and prints its summary (a table, or JSON with `--json`).
pub(crate) fn prepare(a: &PrepareArgs) -> Result<()> {
    let mut opts = PrepareOptions::new(a.tokenizer.clone(), a.out.clone(), a.inputs.clone());
    opts.field = a.field.clone();
    opts.text_unit = a.text_unit;
    opts.held_out = a.held_out;
    opts.seed = a.seed;
    opts.eos = a.eos.clone();
    opts.threads = a.threads;
    opts.unit_bytes = a.unit_bytes;
    opts.progress = !a.json;
    let report = loco_real::prepare::prepare(&opts).map_err(|e| match e {
        PrepareError::Io { .. } | PrepareError::Stopped => anyhow::Error::new(e),
        // Inputs, the tokenizer, options and what DIR holds: the user's to fix.
        e => InputError(e.into()).into(),
    })?;
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print_summary(&mut out, &report)?;
    }
    Ok(())
}

/// The summary for people: what is in DIR, and how fast this run went.
pub(crate) fn print_summary(out: &mut impl Write, r: &PrepareReport) -> std::io::Result<()> {
    let dir = r.dir.display();
    if r.already_finished {
        writeln!(out, "{dir} is already prepared with these arguments: nothing to do")?;
    } else if r.units_resumed > 0 {
        writeln!(
            out,
            "{dir}: resumed, {} of {} units were already written",
            r.units_resumed, r.units
        )?;
    }
    writeln!(
        out,
        "documents   {} (train {}, held out {})",
        r.documents(),
        r.train.documents,
        r.held_out.documents
    )?;
    writeln!(
        out,
        "tokens      {} (train {}, held out {}), u{} little-endian, vocabulary {}",
        r.tokens(),
        r.train.tokens,
        r.held_out.tokens,
        r.token_width * 8,
        r.vocab_size
    )?;
    writeln!(out, "text        {} in {} units", human::bytes(r.text_bytes), r.units)?;
    if !r.already_finished {
        let mbs = r.mb_per_second();
        writeln!(
            out,
            "this run    {} of text in {}: {mbs:.2} MB/s, {:.2} MB/s per thread ({} threads)",
            human::bytes(r.processed_bytes),
            human::seconds(r.seconds),
            mbs / r.threads as f64,
            r.threads
        )?;
    }
    writeln!(out, "train on it with `[real] data = \"{dir}\"` (model vocab >= {})", r.vocab_size)
}

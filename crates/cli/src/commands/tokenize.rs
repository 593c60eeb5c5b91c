//! `tq tokenize`: the token ids of a text under a model's own tokenizer (the one its GGUF file
//! declares: byte-level BPE for SmolLM2, SentencePiece-style for Gemma 3), BOS included when
//! the file asks for it and special tokens written in the text parsed, as `llama-tokenize`
//! does by default.

use clap::Args;
use serde::Serialize;
use tq_models::fetch::ModelSpec;
use tq_models::gguf::Gguf;
use tq_models::tokenizer::Tokenizer;

/// Arguments of `tq tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// The model: `smollm2` (the default), `gemma3-270m` (both fetched on first use) or a
    /// .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
    /// The text to tokenize.
    #[arg(long)]
    text: String,
    /// Print JSON (keys: model, text, ids, pieces).
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct TokenizeReport<'a> {
    model: String,
    text: &'a str,
    ids: Vec<u32>,
    /// Each token's piece as text (lossy for byte tokens that split a character).
    pieces: Vec<String>,
}

/// Runs `tq tokenize`: the ids on one line, space-separated (or JSON with `--json`).
pub fn run(args: &TokenizeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let spec = args.model.clone().unwrap_or_default();
    let path = spec.resolve(|line| eprintln!("{line}"))?;
    let gguf = Gguf::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let ids = tokenizer.encode(&args.text)?;
    if args.json {
        let pieces = ids
            .iter()
            .map(|&id| {
                tokenizer
                    .token_to_piece(id)
                    .map(|p| String::from_utf8_lossy(p).into_owned())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let report = TokenizeReport {
            model: spec.to_string(),
            text: &args.text,
            ids,
            pieces,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let line: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", line.join(" "));
    }
    Ok(())
}

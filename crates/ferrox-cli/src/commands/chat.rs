//! `ferrox chat`: an interactive conversation rendered with the model's chat template. The
//! KV cache keeps the conversation so far; each turn evaluates only the new tokens.

use std::io::{BufRead, Write};

use anyhow::Context;
use ferrox_generate::generate::{generate_speculative, GenerationParams};
use ferrox_models::Engine;
use ferrox_models::EngineExt;
use ferrox_tokenizer::chat_template::{
    prompt_for_tokenizer, ChatMessage, ChatTemplate, RenderOptions,
};

use super::model::{self, ModelArgs};
use super::run::{GrammarArgs, SamplingArgs, SpecArgs};
use super::InputError;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculation: SpecArgs,
    /// Every reply follows this grammar or schema.
    #[command(flatten)]
    pub grammar: GrammarArgs,
    /// A system message to start the conversation with.
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Chat template: `chatml`, a template name stored in the model, or a Jinja file
    /// (default: the model's own; without one, the format its turn markers call for).
    #[arg(long = "chat-template", value_name = "NAME|FILE")]
    pub chat_template: Option<String>,
    /// Most tokens per reply (-1: until the model ends its turn or the context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let sampler = args.sampling.params()?;
    args.grammar.spec()?;
    args.speculation.kind()?;
    let mut loaded = model::load_generator(&args.speculation.target_args(&args.model)?)?;
    args.speculation.prepare_engine(&mut loaded.engine)?;
    let draft_model = args
        .speculation
        .load_draft(&args.model, &loaded.tokenizer)?;
    let tokenizer = std::sync::Arc::new(loaded.tokenizer);
    let decoder = &loaded.engine;
    let mut drafter = match &draft_model {
        Some(d) => Some(d.drafter(decoder.vocab_size(), &sampler)?),
        None => None,
    };
    let constraint = args.grammar.constraint(&tokenizer, decoder.vocab_size())?;
    let tokenizer = &*tokenizer;
    let chosen = match &args.chat_template {
        Some(choice) => Some(
            ferrox_server::resolve_template(Some(choice), decoder, tokenizer)
                .map_err(|e| InputError(format!("{e:#}")))?
                .0,
        ),
        None => ChatTemplate::from_metadata(&decoder.gguf().metadata())?,
    };
    let template = match chosen {
        Some(t) => t,
        None => {
            let vocab = tokenizer.vocab();
            let (t, name) = ChatTemplate::for_vocabulary(|m| vocab.id(m).is_some());
            eprintln!("the model has no chat template; using the {name} format its vocabulary's turn markers call for");
            t
        }
    };
    let vocab = tokenizer.vocab();
    let token_text = |id: Option<u32>| id.map(|i| vocab.text(i).to_string()).unwrap_or_default();
    let options = RenderOptions {
        add_generation_prompt: true,
        bos_token: token_text(vocab.bos()),
        eos_token: token_text(vocab.eos()),
        ..RenderOptions::default()
    };
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system));
    }
    let mut state = decoder.new_state()?;
    // Tokens whose keys and values are in the cache.
    let mut cached: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    eprintln!("chatting with {} (Ctrl-D to leave)", loaded.path.display());
    loop {
        eprint!("\n> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            continue;
        }
        messages.push(ChatMessage::new("user", line));
        let rendered = template
            .render(&messages, &options)
            .context("chat template")?;
        // A BOS the template printed is dropped: the tokenizer adds the model's own.
        let text = prompt_for_tokenizer(&rendered, &options, vocab.add_bos(), vocab.add_eos());
        let tokens = tokenizer.encode(text, true, true);
        let common = cached
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count();
        // Keep at least one token to evaluate so there are logits to sample from.
        let reuse = common.min(tokens.len().saturating_sub(1));
        if tokens.len() >= decoder.context_size() {
            return Err(InputError(format!(
                "the conversation ({} tokens) no longer fits the context ({})",
                tokens.len(),
                decoder.context_size()
            ))
            .into());
        }
        let reuse = state.truncate_or_reset(reuse);
        let params = GenerationParams {
            max_tokens: usize::try_from(args.n_predict).ok(),
            sampler: sampler.clone(),
            draft: args.speculation.draft(),
            constraint: constraint.clone(),
            ..GenerationParams::default()
        };
        if let Some(d) = drafter.as_mut() {
            d.set_context(&tokens[..reuse]);
        }
        let outcome = generate_speculative(
            decoder,
            &mut state,
            reuse,
            tokenizer,
            &tokens[reuse..],
            &params,
            drafter.as_mut(),
            |step| {
                let _ = stdout.write_all(step.text.as_bytes());
                let _ = stdout.flush();
                true
            },
        )?;
        println!();
        cached = tokens;
        cached.extend(&outcome.tokens[..outcome.tokens.len().saturating_sub(1)]);
        messages.push(ChatMessage::new("assistant", outcome.text.trim()));
    }
}

//! `ferrox chat`: an interactive conversation rendered with the model's chat template. The
//! KV cache keeps the conversation so far; each turn evaluates only the new tokens. With
//! `--mmproj`, `/image FILE` attaches an image to the next message: it goes into the message
//! where the server puts an `image_url` part (a `<__media__>` marker in its text), and stays
//! in the conversation, its positions reused from the cache on later turns.

use std::io::{BufRead, Write};
use std::sync::Arc;

use anyhow::Context;
use ferrox_generate::generate::{generate_speculative, GenerationParams};
use ferrox_generate::media::{EncodedImage, MediaPrompt, MEDIA_MARKER};
use ferrox_models::Engine;
use ferrox_models::EngineExt;
use ferrox_tokenizer::chat_template::{
    prompt_for_tokenizer, ChatMessage, ChatTemplate, RenderOptions,
};

use super::model::{self, ModelArgs};
use super::run::{GrammarArgs, SamplingArgs, SpecArgs, SpecType};
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
    /// The model's vision projector (an `mmproj` GGUF): `/image FILE` then attaches an image
    /// to the next message.
    #[arg(long = "mmproj", value_name = "FILE")]
    pub mmproj: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub image_tokens: model::ImageTokenArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let sampler = args.sampling.params()?;
    args.grammar.spec()?;
    if args.speculation.kind()? == SpecType::Draft && args.mmproj.is_some() {
        return Err(InputError(
            "--mmproj and --model-draft do not go together: the draft model cannot read images"
                .into(),
        )
        .into());
    }
    let mut loaded = model::load_generator(&args.speculation.target_args(&args.model)?)?;
    args.speculation.prepare_engine(&mut loaded.engine)?;
    let draft_model = args
        .speculation
        .load_draft(&args.model, &loaded.tokenizer)?;
    let tokenizer = Arc::new(loaded.tokenizer);
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
    let vision = match &args.mmproj {
        Some(path) => Some(model::open_vision(path, decoder, &args.image_tokens)?),
        None => None,
    };
    // The images of the conversation, in the order of their markers in it, and those
    // attached to the next message.
    let mut images: Vec<Arc<EncodedImage>> = Vec::new();
    let mut attached: Vec<Arc<EncodedImage>> = Vec::new();
    let mut state = decoder.new_state()?;
    // Tokens whose keys and values are in the cache.
    let mut cached: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    eprintln!("chatting with {} (Ctrl-D to leave)", loaded.path.display());
    if vision.is_some() {
        eprintln!("/image FILE attaches an image to your next message");
    }
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
        if let Some(path) = line
            .strip_prefix("/image")
            .filter(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
        {
            let path = path.trim();
            match (&vision, path.is_empty()) {
                (None, _) => eprintln!("/image needs --mmproj FILE (the model's vision projector)"),
                (Some(_), true) => eprintln!("/image FILE: which image?"),
                (Some(encoder), false) => {
                    match model::encode_image_file(encoder, std::path::Path::new(path)) {
                        Ok(image) => {
                            attached.push(image);
                            eprintln!(
                                "attached {path} ({} image{} for the next message)",
                                attached.len(),
                                if attached.len() == 1 { "" } else { "s" }
                            );
                        }
                        Err(e) => eprintln!("/image: {e:#}"),
                    }
                }
            }
            continue;
        }
        if vision.is_some() && line.contains(MEDIA_MARKER) {
            // It would take the place of an image.
            eprintln!("{MEDIA_MARKER} marks an image: attach images with /image FILE");
            continue;
        }
        // The images go before the text, as the server's `image_url` parts sent first do.
        let content = format!("{}{line}", MEDIA_MARKER.repeat(attached.len()));
        messages.push(ChatMessage::new("user", &content));
        images.append(&mut attached);
        let rendered = template
            .render(&messages, &options)
            .context("chat template")?;
        // A BOS the template printed is dropped: the tokenizer adds the model's own.
        let text = prompt_for_tokenizer(&rendered, &options, vocab.add_bos(), vocab.add_eos());
        let media = MediaPrompt::build(tokenizer, text, images.clone(), true)
            .map_err(|e| InputError(e.to_string()))?;
        let tokens = media.ids();
        let common = cached
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count();
        // Keep at least one token to evaluate so there are logits to sample from, and no
        // part of an image (each is evaluated whole).
        let reuse = media.reusable(common.min(tokens.len().saturating_sub(1)));
        if tokens.len() >= decoder.context_size() {
            return Err(InputError(format!(
                "the conversation ({} tokens) no longer fits the context ({})",
                tokens.len(),
                decoder.context_size()
            ))
            .into());
        }
        state.truncate_or_reset(reuse);
        // The images and text before the last piece of text go in first.
        let prompt = media
            .feed_prefix(decoder, &mut state)
            .context("evaluating the conversation's images")?;
        let reuse = state.len();
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
            &prompt,
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

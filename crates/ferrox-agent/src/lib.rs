//! What makes ferrox's server agent-ready: constrained decoding over llguidance
//! ([`constraint`], with llama.cpp's GBNF translated by [`gbnf`]), tool calls (per-family
//! formats, streaming parsers and forcing grammars: [`tools`]), reasoning separation
//! ([`reasoning`]) and the three put together over one generation's output ([`output`]).

pub mod constraint;
pub mod gbnf;
pub mod output;
pub mod reasoning;
pub mod schema_depth;
pub mod tools;

pub use constraint::{CompileError, ConstraintCompiler, GrammarSpec};
pub use output::{Delta, OutputParser};
pub use reasoning::{ReasoningFormat, ReasoningSplitter};
pub use tools::{Tool, ToolChoice, ToolFormat, ToolSpec};

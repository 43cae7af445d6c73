//! A reranker's classification head over a pooled embedding, as llama.cpp's rank pooling
//! applies it: `cls` (a dense layer and tanh) if the file has it, then `cls.output` (one
//! score per label), then a softmax over the scores for the Qwen3 rerankers.

use ferrox_gguf::Gguf;

use crate::layers::linear::linear;
use crate::names::{CLS, CLS_OUTPUT};
use crate::tensors::{Loader, MatrixRef};
use crate::ModelError;

/// One dense layer with its optional bias.
#[derive(Clone, Debug)]
struct Dense {
    weight: MatrixRef,
    bias: Option<Vec<f32>>,
}

impl Dense {
    fn apply(&self, gguf: &Gguf, x: &[f32]) -> Result<Vec<f32>, ModelError> {
        let mut y = vec![0.0; self.weight.rows];
        linear(&self.weight.view(gguf)?, x, 1, &mut y, &mut Vec::new())?;
        if let Some(b) = &self.bias {
            y.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
        Ok(y)
    }
}

/// The head, when the file has one.
#[derive(Clone, Debug)]
pub struct ClassifierHead {
    dense: Option<Dense>,
    output: Option<Dense>,
    softmax: bool,
}

impl ClassifierHead {
    /// The file's `cls` and `cls.output` tensors over embeddings of `n_embd` (`None` when it
    /// has neither); `softmax` for the Qwen3 rerankers.
    pub fn load(
        gguf: &Gguf,
        n_embd: usize,
        softmax: bool,
    ) -> Result<Option<ClassifierHead>, ModelError> {
        let l = Loader { gguf };
        let dense = match l.opt_matrix(&CLS.weight(), n_embd, n_embd)? {
            Some(weight) => Some(Dense {
                weight,
                bias: l.opt_vector(&CLS.bias(), n_embd)?,
            }),
            None => None,
        };
        let output = match l.find(&CLS_OUTPUT.weight()) {
            Some(t) => {
                let labels = t.shape.get(1).copied().unwrap_or(1) as usize;
                Some(Dense {
                    weight: l.matrix(&CLS_OUTPUT.weight(), n_embd, labels)?,
                    bias: l.opt_vector(&CLS_OUTPUT.bias(), labels)?,
                })
            }
            None => None,
        };
        if dense.is_none() && output.is_none() {
            return Ok(None);
        }
        Ok(Some(ClassifierHead {
            dense,
            output,
            softmax,
        }))
    }

    /// The scores of a pooled embedding.
    pub fn apply(&self, gguf: &Gguf, pooled: &[f32]) -> Result<Vec<f32>, ModelError> {
        let mut x = pooled.to_vec();
        if let Some(d) = &self.dense {
            x = d.apply(gguf, &x)?;
            x.iter_mut().for_each(|v| *v = v.tanh());
        }
        if let Some(o) = &self.output {
            x = o.apply(gguf, &x)?;
        }
        if self.softmax {
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f64;
            x.iter_mut().for_each(|v| {
                *v = (*v - max).exp();
                sum += f64::from(*v);
            });
            let inv = (1.0 / sum) as f32;
            x.iter_mut().for_each(|v| *v *= inv);
        }
        Ok(x)
    }
}

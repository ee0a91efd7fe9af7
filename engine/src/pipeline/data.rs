//! The training samples a pipeline draws from. Lazy sampling needs a finite, indexed set
//! (a sample is either fresh or one seen before), so text is cut into consecutive windows:
//! sample `i` is the `context + 1` bytes from `i · context`.

use super::model::ModelSpec;
use crate::data::ImageSet;
use crate::error::{Error, Result};
use crate::tensor::{Device, Tensor};

pub enum PipelineData {
    Images(ImageSet),
    Text(TextWindows),
}

/// Non-overlapping windows of a byte text, each `context` inputs and their next bytes.
pub struct TextWindows {
    text: Vec<u8>,
    context: usize,
}

impl TextWindows {
    pub fn new(text: Vec<u8>, context: usize) -> Result<Self> {
        if context == 0 || text.len() <= context {
            return Err(Error::Data(format!(
                "{} bytes of text for windows of {context}",
                text.len()
            )));
        }
        Ok(TextWindows { text, context })
    }

    pub fn len(&self) -> usize {
        (self.text.len() - 1) / self.context
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn context(&self) -> usize {
        self.context
    }

    /// Inputs and targets of windows `ids`, each `[ids.len() * context]`.
    pub fn batch(&self, ids: &[usize]) -> (Vec<u32>, Vec<u32>) {
        let c = self.context;
        let mut inputs = Vec::with_capacity(ids.len() * c);
        let mut targets = Vec::with_capacity(ids.len() * c);
        for &i in ids {
            let window = &self.text[i * c..i * c + c + 1];
            inputs.extend(window[..c].iter().map(|&b| u32::from(b)));
            targets.extend(window[1..].iter().map(|&b| u32::from(b)));
        }
        (inputs, targets)
    }
}

impl From<ImageSet> for PipelineData {
    fn from(set: ImageSet) -> Self {
        PipelineData::Images(set)
    }
}

impl From<TextWindows> for PipelineData {
    fn from(windows: TextWindows) -> Self {
        PipelineData::Text(windows)
    }
}

impl PipelineData {
    pub fn len(&self) -> usize {
        match self {
            PipelineData::Images(s) => s.len(),
            PipelineData::Text(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An error unless the data fits the model's input and output.
    pub fn check_fits(&self, model: &ModelSpec) -> Result<()> {
        let fits = match (self, model) {
            (PipelineData::Images(s), ModelSpec::Mlp(sizes)) => {
                s.features() == sizes[0] && s.classes <= sizes[sizes.len() - 1]
            }
            (PipelineData::Text(t), ModelSpec::Gpt(c)) => t.context == c.context && c.vocab >= 256,
            _ => false,
        };
        if fits && !self.is_empty() {
            return Ok(());
        }
        let data = match self {
            PipelineData::Images(s) => format!(
                "{} images of {} features in {} classes",
                s.len(),
                s.features(),
                s.classes
            ),
            PipelineData::Text(t) => format!("{} byte windows of {}", t.len(), t.context),
        };
        Err(Error::Config(format!("{data} do not fit {model}")))
    }

    /// Stage 0's input for samples `ids` (features or token ids) and the last stage's labels.
    pub fn batch(&self, device: &Device, ids: &[usize]) -> Result<(Tensor, Tensor)> {
        match self {
            PipelineData::Images(s) => {
                let (x, labels) = s.batch(ids);
                Ok((
                    Tensor::from_vec(device, &[ids.len(), s.features()], x)?,
                    Tensor::from_u32(device, &[ids.len()], labels)?,
                ))
            }
            PipelineData::Text(t) => {
                let (inputs, targets) = t.batch(ids);
                Ok((
                    Tensor::from_u32(device, &[ids.len(), t.context], inputs)?,
                    Tensor::from_u32(device, &[ids.len() * t.context], targets)?,
                ))
            }
        }
    }
}

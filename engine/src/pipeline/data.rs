//! The training samples a pipeline draws from. Lazy sampling needs a finite, indexed set
//! (a sample is either fresh or one seen before), so text is cut into consecutive windows:
//! sample `i` is the `context + 1` bytes from `i · context`.

use super::model::ModelSpec;
use crate::data::ImageSet;
use crate::error::{Error, Result};
use crate::tensor::{Device, Tensor};

/// The indexed training samples a pipeline draws from: labelled images for an MLP, byte windows for
/// a GPT.
pub enum PipelineData {
    /// Labelled images, one sample per image.
    Images(ImageSet),
    /// Byte text cut into non-overlapping windows, one sample per window.
    Text(TextWindows),
}

/// Non-overlapping windows of a byte text, each `context` inputs and their next bytes.
pub struct TextWindows {
    text: Vec<u8>,
    context: usize,
}

impl TextWindows {
    /// Cuts `text` into windows of `context` inputs; fails if `context` is zero or the text holds
    /// no whole window.
    pub fn new(text: Vec<u8>, context: usize) -> Result<Self> {
        if context == 0 || text.len() <= context {
            return Err(Error::Data(format!(
                "{} bytes of text for windows of {context}",
                text.len()
            )));
        }
        Ok(TextWindows { text, context })
    }

    /// Number of whole windows, `(text bytes - 1) / context`.
    pub fn len(&self) -> usize {
        (self.text.len() - 1) / self.context
    }

    /// Whether there is no whole window.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Input bytes per window; each window also reads the byte after its last input as a target.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Window `i`: its `context` inputs followed by the byte after them.
    fn window(&self, i: usize) -> &[u8] {
        &self.text[i * self.context..][..self.context + 1]
    }

    /// Input bytes of windows `ids`, `[ids.len() * context]`.
    pub fn inputs(&self, ids: &[usize]) -> Vec<u32> {
        let c = self.context;
        ids.iter()
            .flat_map(|&i| self.window(i)[..c].iter().map(|&b| u32::from(b)))
            .collect()
    }

    /// Next-byte targets of windows `ids`: each input shifted by one, `[ids.len() * context]`.
    pub fn targets(&self, ids: &[usize]) -> Vec<u32> {
        ids.iter()
            .flat_map(|&i| self.window(i)[1..].iter().map(|&b| u32::from(b)))
            .collect()
    }

    /// Inputs and targets of windows `ids`.
    pub fn batch(&self, ids: &[usize]) -> (Vec<u32>, Vec<u32>) {
        (self.inputs(ids), self.targets(ids))
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
    /// Number of samples.
    pub fn len(&self) -> usize {
        match self {
            PipelineData::Images(s) => s.len(),
            PipelineData::Text(t) => t.len(),
        }
    }

    /// Whether there are no samples.
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

    /// Stage 0's input for samples `ids`: features `[ids.len(), features]` or token ids
    /// `[ids.len(), context]`.
    pub fn inputs(&self, device: &Device, ids: &[usize]) -> Result<Tensor> {
        match self {
            PipelineData::Images(s) => {
                Tensor::from_vec(device, &[ids.len(), s.features()], s.batch(ids).0)
            }
            PipelineData::Text(t) => {
                Tensor::from_u32(device, &[ids.len(), t.context], t.inputs(ids))
            }
        }
    }

    /// The last stage's labels for samples `ids`: one class per image, one next byte per
    /// input byte.
    pub fn labels(&self, device: &Device, ids: &[usize]) -> Result<Tensor> {
        match self {
            PipelineData::Images(s) => {
                let labels = ids.iter().map(|&i| u32::from(s.labels[i])).collect();
                Tensor::from_u32(device, &[ids.len()], labels)
            }
            PipelineData::Text(t) => {
                Tensor::from_u32(device, &[ids.len() * t.context], t.targets(ids))
            }
        }
    }
}

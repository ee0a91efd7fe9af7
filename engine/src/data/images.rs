//! Labelled image datasets in IDX files: MNIST and Fashion-MNIST.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::idx::read_idx_file;
use crate::error::{Error, Result};

/// The image datasets murmur knows, with their folder below the data root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageDataset {
    /// The handwritten digits of LeCun et al., 28×28 greyscale, 10 classes.
    Mnist,
    /// Zalando's clothing images in MNIST's format, 28×28 greyscale, 10 classes.
    FashionMnist,
}

impl ImageDataset {
    /// The dataset's folder name below the data root.
    pub fn folder(self) -> &'static str {
        match self {
            ImageDataset::Mnist => "mnist",
            ImageDataset::FashionMnist => "fashion-mnist",
        }
    }

    /// The dataset's display name, for logs and reports.
    pub fn name(self) -> &'static str {
        match self {
            ImageDataset::Mnist => "MNIST",
            ImageDataset::FashionMnist => "Fashion-MNIST",
        }
    }

    /// Images in the training split as published (both have 60,000): what a server hands
    /// out per epoch without loading the files.
    pub fn train_samples(self) -> usize {
        match self {
            ImageDataset::Mnist | ImageDataset::FashionMnist => 60_000,
        }
    }

    /// Values per image (28 × 28 grey levels for both): what a model of the dataset takes in,
    /// known without loading the files.
    pub fn features(self) -> usize {
        match self {
            ImageDataset::Mnist | ImageDataset::FashionMnist => 28 * 28,
        }
    }

    /// Classes of the labels (ten for both).
    pub fn classes(self) -> usize {
        match self {
            ImageDataset::Mnist | ImageDataset::FashionMnist => 10,
        }
    }

    /// Loads one split from `root/<folder>/`.
    pub fn load(self, root: &Path, split: Split) -> Result<ImageSet> {
        ImageSet::load(&root.join(self.folder()), split, self.name())
    }
}

impl FromStr for ImageDataset {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mnist" => Ok(ImageDataset::Mnist),
            "fashion-mnist" | "fashion_mnist" | "fmnist" => Ok(ImageDataset::FashionMnist),
            other => Err(Error::Config(format!(
                "unknown image dataset {other:?}: use mnist or fashion-mnist"
            ))),
        }
    }
}

/// Which part of a dataset to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The training images (`train-*` files).
    Train,
    /// The held-out test images (`t10k-*` files).
    Test,
}

impl Split {
    fn prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "t10k",
        }
    }
}

/// Images as bytes `[n, rows, cols]` with one label byte each.
#[derive(Debug, Clone)]
pub struct ImageSet {
    /// Pixel bytes of every image, `[n, rows, cols]` row-major, 0 black to 255 white.
    pub images: Vec<u8>,
    /// One class label per image, below `classes`.
    pub labels: Vec<u8>,
    /// Height of each image in pixels.
    pub rows: usize,
    /// Width of each image in pixels.
    pub cols: usize,
    /// Number of classes the labels range over.
    pub classes: usize,
}

/// The IDX file `stem` in `dir`, raw or gzipped.
fn find(dir: &Path, stem: &str, name: &str) -> Result<PathBuf> {
    [stem.to_string(), format!("{stem}.gz")]
        .iter()
        .map(|f| dir.join(f))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Data(format!(
                "{name} not found: no {stem} or {stem}.gz in {}. Run scripts/fetch-data.sh \
                 (or set MURMUR_DATA to the folder that holds mnist/ and fashion-mnist/).",
                dir.display()
            ))
        })
}

impl ImageSet {
    /// Loads `<split>-images-idx3-ubyte` and `<split>-labels-idx1-ubyte` (optionally `.gz`)
    /// from `dir`, checking that they agree and that labels are below 10.
    pub fn load(dir: &Path, split: Split, name: &str) -> Result<ImageSet> {
        let p = split.prefix();
        let images_path = find(dir, &format!("{p}-images-idx3-ubyte"), name)?;
        let labels_path = find(dir, &format!("{p}-labels-idx1-ubyte"), name)?;
        let images = read_idx_file(&images_path)?;
        let labels = read_idx_file(&labels_path)?;
        let &[n, rows, cols] = images.dims.as_slice() else {
            return Err(Error::Data(format!(
                "{}: images need 3 dimensions, found {:?}",
                images_path.display(),
                images.dims
            )));
        };
        if labels.dims != [n] {
            return Err(Error::Data(format!(
                "{} has {:?} labels but {} has {n} images",
                labels_path.display(),
                labels.dims,
                images_path.display()
            )));
        }
        let classes = 10;
        if let Some(bad) = labels.data.iter().find(|&&l| l as usize >= classes) {
            return Err(Error::Data(format!(
                "{}: label {bad} is not a class 0-9",
                labels_path.display()
            )));
        }
        Ok(ImageSet {
            images: images.data,
            labels: labels.data,
            rows,
            cols,
            classes,
        })
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the set holds no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Pixels per image.
    pub fn features(&self) -> usize {
        self.rows * self.cols
    }

    /// Pixels scaled to [0, 1] (`[indices.len(), features]`) and labels as u32.
    pub fn batch(&self, indices: &[usize]) -> (Vec<f32>, Vec<u32>) {
        let f = self.features();
        let mut x = Vec::with_capacity(indices.len() * f);
        for &i in indices {
            x.extend(self.images[i * f..][..f].iter().map(|&p| p as f32 / 255.0));
        }
        let y = indices.iter().map(|&i| self.labels[i] as u32).collect();
        (x, y)
    }

    /// The first `n` samples (for quick runs).
    pub fn truncate(&mut self, n: usize) {
        let n = n.min(self.len());
        self.images.truncate(n * self.features());
        self.labels.truncate(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_say_how_to_get_them() {
        let err = ImageDataset::Mnist
            .load(Path::new("/nonexistent"), Split::Train)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("scripts/fetch-data.sh") && err.contains("train-images-idx3-ubyte"),
            "{err}"
        );
        assert!("cifar".parse::<ImageDataset>().is_err());
    }

    #[test]
    fn loads_a_small_set_and_checks_agreement() {
        let dir = std::env::temp_dir().join(format!("murmur-imgs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let header = |dims: &[u32]| {
            let mut v = vec![0, 0, 8, dims.len() as u8];
            dims.iter().for_each(|d| v.extend(d.to_be_bytes()));
            v
        };
        std::fs::write(
            dir.join("t10k-images-idx3-ubyte"),
            [header(&[2, 2, 2]), vec![0, 255, 51, 102, 1, 2, 3, 4]].concat(),
        )
        .unwrap();
        std::fs::write(
            dir.join("t10k-labels-idx1-ubyte"),
            [header(&[2]), vec![7, 3]].concat(),
        )
        .unwrap();
        let set = ImageSet::load(&dir, Split::Test, "test set").unwrap();
        assert_eq!((set.len(), set.rows, set.cols), (2, 2, 2));
        let (x, y) = set.batch(&[1, 0]);
        assert_eq!(y, [3, 7]);
        assert_eq!(&x[4..], [0.0, 1.0, 0.2, 0.4]);
        // A label outside 0-9 is refused.
        std::fs::write(
            dir.join("t10k-labels-idx1-ubyte"),
            [header(&[2]), vec![7, 10]].concat(),
        )
        .unwrap();
        assert!(ImageSet::load(&dir, Split::Test, "t")
            .unwrap_err()
            .to_string()
            .contains("label 10"));
        // Counts that disagree are refused.
        std::fs::write(
            dir.join("t10k-labels-idx1-ubyte"),
            [header(&[3]), vec![1, 2, 3]].concat(),
        )
        .unwrap();
        assert!(ImageSet::load(&dir, Split::Test, "t").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

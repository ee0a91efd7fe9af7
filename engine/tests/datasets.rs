//! The fetched datasets load with the sizes and label histograms they are known to have.

mod common;

use murmur_engine::data::{ImageDataset, ImageSet};

fn histogram(set: &ImageSet) -> Vec<usize> {
    let mut h = vec![0; 10];
    set.labels.iter().for_each(|&l| h[l as usize] += 1);
    h
}

#[test]
fn mnist_has_its_canonical_counts() {
    let Some((train, test)) = common::mnist_or_skip("mnist_has_its_canonical_counts") else {
        return;
    };
    assert_eq!((train.len(), train.rows, train.cols), (60_000, 28, 28));
    assert_eq!(
        histogram(&train),
        [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    );
    assert_eq!(
        histogram(&test),
        [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    );
    let (x, _) = train.batch(&[0]);
    assert!(x.iter().all(|v| (0.0..=1.0).contains(v)) && x.iter().any(|&v| v > 0.5));
}

#[test]
fn fashion_mnist_loads_from_gzip_with_balanced_classes() {
    let Some((train, test)) = common::dataset_or_skip(ImageDataset::FashionMnist, "fashion_mnist")
    else {
        return;
    };
    assert_eq!((train.len(), test.len()), (60_000, 10_000));
    assert_eq!(histogram(&train), vec![6000; 10]);
    assert_eq!(histogram(&test), vec![1000; 10]);
    assert_eq!(&train.labels[..8], &[9, 0, 0, 3, 0, 2, 7, 2]);
}

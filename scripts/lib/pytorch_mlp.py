"""PyTorch's CPU time for one MNIST epoch of the MLP murmur trains by default (784-512-256-10,
ReLU, AdamW lr 1e-3 without weight decay, batch 128 with the last partial batch, pixels / 255),
for scripts/pytorch-mlp.sh. Prints one JSON line: seconds per epoch and test accuracy."""
import gzip
import json
import sys
import time

import numpy as np
import torch


def idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(folder, split):
    images = idx(f"{folder}/{split}-images-idx3-ubyte")
    labels = idx(f"{folder}/{split}-labels-idx1-ubyte")
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def main():
    folder, epochs, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x, y = load(folder, "train")
    x_test, y_test = load(folder, "t10k")
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    loss_fn = torch.nn.CrossEntropyLoss()
    seconds = []
    for _ in range(epochs):
        start = time.perf_counter()
        order = torch.randperm(len(x))
        for i in range(0, len(x), 128):
            batch = order[i:i + 128]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x[batch]), y[batch]).backward()
            opt.step()
        seconds.append(time.perf_counter() - start)
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    print(json.dumps({"torch": torch.__version__, "threads": threads,
                      "epoch_seconds": seconds, "test_accuracy": accuracy}))


main()

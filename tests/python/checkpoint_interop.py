"""Python's side of the checkpoint interop tests (Debian's python3-torch).

  check-ours DIR     loads DIR/model.pt (written by ddp) with torch.load's weights_only=True into
                     nn.DataParallel(MLP) with strict=True, runs DIR/batch.pt's input and compares
                     with the output ddp computed; exits 1 when they differ by more than 1e-5.
  save-python DIR    writes an MLP's weights the ways Python users do, and its output on a batch,
                     for ddp to load:
                       plain.pt       torch.save(dict(model.state_dict()))
                       prefixed.pt    torch.save(dict(nn.DataParallel(model).state_dict()))
                       ordered.pt     torch.save(model.state_dict())  (an OrderedDict)
                       cuda.pt        dict(model.state_dict()) as saved on a GPU (location cuda:0)
                       batch.pt       {"input": x, "output": model(x)}
"""
import sys

import torch
import torch.nn as nn
import torch.serialization


def mlp():
    # ddp::models::make_mlp(784, 10): the same modules, so the same state dict keys.
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                         nn.ReLU(), nn.Linear(256, 10))


def check_ours(directory):
    weights = torch.load(f"{directory}/model.pt", weights_only=True)
    model = nn.DataParallel(mlp())
    model.load_state_dict(weights, strict=True)
    batch = torch.load(f"{directory}/batch.pt", weights_only=True)
    model.eval()
    with torch.no_grad():
        output = model(batch["input"])
    diff = (output - batch["output"]).abs().max().item()
    print(f"keys {sorted(weights)}; max abs diff {diff:.3g}")
    return 0 if diff <= 1e-5 else 1


def save_python(directory):
    torch.manual_seed(7)
    model = mlp().eval()
    torch.save(dict(model.state_dict()), f"{directory}/plain.pt")
    torch.save(dict(nn.DataParallel(model).state_dict()), f"{directory}/prefixed.pt")
    torch.save(model.state_dict(), f"{directory}/ordered.pt")
    # What a GPU machine writes: the storages say cuda:0. Python itself refuses to load this on a
    # CPU-only machine without map_location.
    real_tag = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(dict(model.state_dict()), f"{directory}/cuda.pt")
    finally:
        torch.serialization.location_tag = real_tag
    try:
        torch.load(f"{directory}/cuda.pt")
        print("cuda.pt loaded without map_location: not a GPU-saved file")
        return 1
    except RuntimeError:
        pass
    x = torch.randn(16, 1, 28, 28)
    with torch.no_grad():
        torch.save({"input": x, "output": model(x)}, f"{directory}/batch.pt")
    return 0


if __name__ == "__main__":
    mode, directory = sys.argv[1], sys.argv[2]
    sys.exit({"check-ours": check_ours, "save-python": save_python}[mode](directory))

"""The TinyModel of PyTorch's tutorials, on actorflow: print it, run it, train it a step.

python examples/tiny_model.py
"""

import actorflow as af
from actorflow import nn, optim


class TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(100, 200)
        self.activation = nn.ReLU()
        self.linear2 = nn.Linear(200, 10)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        return self.softmax(self.linear2(self.activation(self.linear1(x))))


def main():
    af.manual_seed(0)
    model = TinyModel()
    print(model)
    x = af.rand(4, 100)
    y = model(x)
    print("output", y.shape, "rows sum to", y.sum(dim=1).numpy())
    print("parameters:", sum(p.numel() for p in model.parameters()))

    target = af.tensor([1, 3, 5, 7])
    opt = optim.SGD(model.parameters(), lr=0.5)
    for step in range(5):
        opt.zero_grad()
        loss = nn.functional.nll_loss(af.log(model(x)), target)
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

"""The quickstart: eager ops queue work on the VM; reading values waits for it."""

import asyncio

import actorflow as af

x = af.tensor([[1.0, -1.0], [1.0, -1.0]])  # float32 on cpu by default
y = af.relu(x)  # returns at once: the work is queued
# prints: tensor([[1., 0.], [1., 0.]], dtype=actorflow.float32)
print(y)
z = (x @ x.T).sum(dim=1, keepdim=True) + 1
print(z.numpy())
af.synchronize()


async def main():  # inside a running event loop
    w = af.relu(x) * 2
    print(await w.numpy_async())  # never blocks the loop


asyncio.run(main())

# Errors name the op, the values and the fix, and leave the runtime working.
try:
    af.ones(2, 3) @ af.ones(4, 5)
except af.ShapeError as e:
    print("ShapeError:", e)
try:
    af.ones(2) + af.ones(2, device="null")
except af.DeviceError as e:
    print("DeviceError:", e)
print(af.lowlevel.vm_stats())

"""The virtual machine: instructions ordered by operand access and stream, on asyncio."""

from .instruction import ACCESS, OP_CALL, RELEASE, Access, Instruction, Operand
from .scheduler import VM, get_vm

__all__ = ["ACCESS", "OP_CALL", "RELEASE", "Access", "Instruction", "Operand", "VM", "get_vm"]

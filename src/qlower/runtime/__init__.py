from .compiled import CompiledModule, load
from ..input_spec import InputSpec, check_inputs, input_specs_of

__all__ = ["CompiledModule", "load", "InputSpec", "check_inputs", "input_specs_of"]

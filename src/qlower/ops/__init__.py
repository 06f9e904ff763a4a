"""torch.library ops in namespace `qlower`. Importing this package registers them."""
from . import integer  # noqa: F401  (registration side effect)

"""torch.library ops in namespace `qlower`. Importing this package registers them."""
from . import integer, weight_only  # noqa: F401  (registration side effect)

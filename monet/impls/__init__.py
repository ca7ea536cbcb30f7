"""Operator implementations (MONeT Sec. 4): one module per operator family.

Importing this package registers every implementation (`monet.impls.registry.IMPLS`).
"""
from monet.impls import activation, attention, batchnorm, conv, dropout, pooling  # noqa: F401  (registration)
from monet.impls.registry import (DEFAULT, IMPLS, MODE_TOKENS, MODES, Impl, apply_impls, impls_for,  # noqa: F401
                                  mode_tokens, variant)
from monet.impls.lowering import lower_for_device  # noqa: F401

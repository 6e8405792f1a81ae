"""The thesis model (784 -> 512 ReLU -> 10) in numpy, its optimizers, MNIST loading, backends.

Only numpy is needed here; the LiteRT backend (``litert_backend``, ``tflite_builder``) imports
``ai_edge_litert`` lazily so that a device without it still runs the numpy backend.
"""

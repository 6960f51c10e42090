"""Registration of keras-vit's classes with Keras' serialization.

Every layer, model, schedule and loss that a `.keras` file may hold is registered under
the package name `keras_vit`, so `keras.saving.load_model` finds it by that name.
"""

import keras


def serializable(cls):
    """Class decorator: registers `cls` with Keras as `keras_vit>ClassName`.

    Example:

    >>> @serializable
    ... class Identity(keras.layers.Layer):
    ...     def call(self, x):
    ...         return x
    >>> keras.saving.get_registered_name(Identity)
    'keras_vit>Identity'
    """
    return keras.saving.register_keras_serializable(package="keras_vit")(cls)

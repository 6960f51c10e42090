"""`python -m keras_vit` is the `keras-vit` command."""

from keras_vit.cli import main

raise SystemExit(main())

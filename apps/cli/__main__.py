"""``python -m flowerbed.apps.cli``: the ``flowerbed`` console script."""

from flowerbed.apps.cli import main

main()

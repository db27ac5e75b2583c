"""One module per TTS variant, and the backbones they share."""

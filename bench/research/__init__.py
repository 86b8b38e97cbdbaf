"""Experiments worth keeping that no served feature rests on (bench/README.md says what each asked)."""

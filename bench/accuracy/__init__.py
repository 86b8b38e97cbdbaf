"""Accuracy of record: exported models scored on the same test images, and several seeds compared."""

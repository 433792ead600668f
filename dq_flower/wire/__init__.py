"""Wire formats both ends import: encode/decode pairs, no policy, no method or config import."""

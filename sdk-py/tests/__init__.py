"""The SDK's own tests (`python3 -m unittest` in sdk-py/)."""

"""The pure decisions every driver obeys, and the job lifecycle they decide on."""

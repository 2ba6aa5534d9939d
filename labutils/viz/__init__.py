"""Layer 6: what a student sees: plots, the labs' figures, timelines and control panels."""

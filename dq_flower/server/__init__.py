"""What every strategy of the package shares on the server: sampling, screening, steps."""

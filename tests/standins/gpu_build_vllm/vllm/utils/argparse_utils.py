import argparse

FlexibleArgumentParser = argparse.ArgumentParser

#!/bin/bash
#SBATCH --gpus=2
echo "--num-layers 24 is what we would use"
python my_trainer.py --layers 24 --lr 3e-4

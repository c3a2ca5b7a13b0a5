"""OpenForgeClaw: claw task sets, mock services, graders and a training recipe for openforge."""

// placeholder, replaced by the bench argument parser
#pragma once
